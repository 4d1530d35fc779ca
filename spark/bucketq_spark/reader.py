"""Read bucket documents through the connector and explode them into one row per message.

The message columns (``MESSAGE_COLUMNS``), in this order:

    bucket_id    STRING     the bucket's ObjectId as 24 hex digits
    slot         INT        the message's index in the bucket
    message_id   STRING     ``o[slot]`` for retried messages, else ``"<bucket_id>:<slot>"`` (bucketq's id)
    tries        LONG       deliveries before this one: ``t[slot] + c - 1``
    enqueued_at  TIMESTAMP  ``e[slot]``, else the bucket's ``created``
    key          STRING     dedupe key or null
    headers      STRING     the headers document as JSON, or null
    payload      STRUCT     ``from_json(p[slot], payload_schema)`` (``bson``: ``p[slot]`` as the connector reads it):
                            the schema is the caller's, never inferred
    malformed    BOOLEAN    the payload does not parse with the schema; ``payload`` is then partial or null

``malformed`` is Spark's own verdict (``from_json`` in PERMISSIVE mode with a corrupt-record column, or a null
result): invalid JSON, a value of the wrong type for its field (``"amount": "x"`` for a DOUBLE, ``1.5`` for a
LONG), a top-level value that is not an object (``42``, ``[...]``, ``null``), an empty string. A missing field
is not malformed (it reads as null), nor is an extra one, nor text after the first JSON value (Spark ignores it).
The batch job quarantines malformed messages instead of handing them to ``process`` (``BatchJob(malformed=...)``).

Slots listed in ``done`` (finished by an async consumer before a crash) are skipped.

Codecs: a read takes the buckets of one codec (``read_buckets(codec=...)`` matches ``enc``): ``"json"`` (the
default) or ``"bson"``. Given the ``payload_schema``, ``bson`` buckets are read as ``p ARRAY<STRUCT<...>>``:
the connector maps each payload's fields to columns, with no JSON parse. It converts between numeric types (a
double read as LONG is truncated, one beyond its range clamped; a numeric string is parsed) and renders any
value as text for a STRING field; a value it cannot convert (text or a boolean for a LONG, an array for a
struct) fails the whole read (``DataException``, its default FAILFAST mode: its PERMISSIVE mode flags the
bucket's document, not the payload, and only for the columns a query happens to read). Without the
``payload_schema``, ``bson`` buckets are read with ``p`` as text, the connector rendering each document as
relaxed extended JSON, and decoded by ``from_json`` like ``json`` ones: the slower path, which flags the one
payload that does not fit as ``malformed`` (a date or decimal field, written ``{"$date": ...}`` there, reads as
malformed). The batch job reads a batch the first way, and a batch whose read fails the second way
(``BatchJob(codec="bson")``); its claim quarantines buckets of the other codecs. A collection holding both
codecs is read once per codec and the two unioned (``unionByName``: the columns are the same).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import json_util

from bucketq.core import claims
from bucketq.core.format import DOCUMENT_CODEC
from bucketq.errors import InvalidOption
from bucketq.shell.connection import check_uri
from bucketq_spark.session import PAGINATE_INTO_PARTITIONS, SINGLE_PARTITION

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

BUCKET_SCHEMA = (
    "_id STRING, created TIMESTAMP, c LONG, p ARRAY<STRING>, done ARRAY<LONG>, h ARRAY<STRING>, "
    "k ARRAY<STRING>, t ARRAY<LONG>, o ARRAY<STRING>, e ARRAY<TIMESTAMP>"
)
BUCKET_FIELDS = ("_id", "created", "c", "p", "done", "h", "k", "t", "o", "e")
# What the reader decodes: the JSON text of ``json`` buckets, the documents of ``bson`` buckets
READ_CODECS = ("json", DOCUMENT_CODEC)
MESSAGE_COLUMNS = ("bucket_id", "slot", "message_id", "tries", "enqueued_at", "key", "headers", "payload", "malformed")
# from_json's corrupt-record field, added to the caller's schema for the decode and dropped from ``payload``
CORRUPT_FIELD = "_bucketq_corrupt_record"
# from_json options the reader sets itself: malformed payloads must be seen, never turned into an exception
RESERVED_JSON_OPTIONS = ("mode", "columnNameOfCorruptRecord")
# The filter on unfinished slots and the message columns before the payload's two, as SQL text: Spark parses a
# list in one call, where pyspark's functions take a py4j round trip a function and a column (about forty here:
# 41 to 110 ms of the Spark JVM's CPU and 17 to 21 ms of Python's a query, against 16 to 33 and 3; bench/README.md).
UNFINISHED_SQL = "NOT coalesce(array_contains(done, CAST(slot AS BIGINT)), false)"
MESSAGE_SQL = (
    "_id AS bucket_id",
    "slot",
    "coalesce(get(o, slot), concat_ws(':', _id, CAST(slot AS STRING))) AS message_id",
    "coalesce(get(t, slot), 0) + c - 1 AS tries",
    "coalesce(get(e, slot), created) AS enqueued_at",
    "get(k, slot) AS key",
    "get(h, slot) AS headers",
)


@dataclass(frozen=True)
class ReadOptions:
    """How the connector splits a read.

    ``partitions``: None picks ``min(defaultParallelism, docs - 1)``, raised to one partition per
    ``partition_bytes`` of the expected data when that is known; 1 reads in one partition
    (``SinglePartitionPartitioner``), n > 1 uses ``PaginateIntoPartitionsPartitioner`` with at most n
    partitions. Both work on any server (no ``$collStats``, which the test server lacks). ``partition_bytes``
    (32 MiB) keeps each partition's reply under the Java driver's 48 MB message limit on servers that answer an
    aggregate in one batch, as the test server does (a real MongoDB sends 16 MiB batches). ``partitioner``
    (a class name) and ``partitioner_options`` (without the ``partitioner.options.`` prefix) override the
    choice, e.g. ``SamplePartitioner`` on a real MongoDB. ``options`` are passed to the reader as they are.
    """

    partitions: int | None = None
    partitioner: str | None = None
    partitioner_options: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, str] = field(default_factory=dict)
    partition_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        if self.partitions is not None and self.partitions < 1:
            raise InvalidOption(f"partitions must be None or >= 1, got {self.partitions!r}")
        if self.partition_bytes < 1:
            raise InvalidOption(f"partition_bytes must be >= 1, got {self.partition_bytes!r}")

    def partition_count(self, expected_docs: int | None, parallelism: int, expected_bytes: int | None = None) -> int:
        """The partitions a read of ``expected_docs`` documents (``expected_bytes`` of BSON) gets."""
        if self.partitions is not None:
            return self.partitions
        docs = expected_docs or parallelism
        by_size = -(-(expected_bytes or 0) // self.partition_bytes)
        # Asked for as many partitions as there are documents, the paginating partitioner makes one per document
        # and warns ("Inefficient partitioning, returning a partition per document"): one fewer puts two
        # documents in some partitions instead, unless each document alone fills a partition's bytes.
        most = docs - 1 if expected_docs and docs > 1 and by_size < docs else docs
        return max(1, min(most, max(parallelism, by_size)))

    def reader_options(self, expected_docs: int | None, parallelism: int,
                       expected_bytes: int | None = None) -> dict[str, str]:
        if self.partitioner is not None:
            name, opts = self.partitioner, dict(self.partitioner_options)
        else:
            n = self.partition_count(expected_docs, parallelism, expected_bytes)
            name = SINGLE_PARTITION if n <= 1 else PAGINATE_INTO_PARTITIONS
            opts = {} if n <= 1 else {"max.number.of.partitions": str(n), **self.partitioner_options}
        out = {"partitioner": name, **{f"partitioner.options.{k}": str(v) for k, v in opts.items()}}
        out.update({k: str(v) for k, v in self.options.items()})
        return out


def read_buckets(spark: SparkSession, uri: str, database: str, queue: str, *, token: str | None = None,
                 ids: Sequence[Any] | None = None, pipeline: list[dict[str, Any]] | None = None,
                 expected_docs: int | None = None, read: ReadOptions | None = None,
                 expected_bytes: int | None = None, codec: str = "json",
                 payload_schema: str | StructType | None = None) -> DataFrame:
    """The bucket documents of ``queue`` whose payloads' codec is ``codec`` (all live ones, or those leased under
    ``token``) as rows of ``BUCKET_SCHEMA``; for ``"bson"`` with a ``payload_schema``, of its ``bucket_schema``.
    ``ids``, the ``_id``s of the buckets a batch claimed, make the server find them by its ``_id`` index instead of
    scanning the collection for the token. ``pipeline`` stages run after that match, before the projection.
    ``expected_docs`` and ``expected_bytes`` (their BSON size) size the partitions (``ReadOptions``)."""
    check_uri(uri)  # before the connector could echo it
    if codec not in READ_CODECS:
        raise InvalidOption(f"codec must be one of {', '.join(READ_CODECS)}, got {codec!r}")
    match: dict[str, Any] = claims.LIVE if token is None else {"lease.token": token}
    if ids is not None:
        match = {"_id": {"$in": list(ids)}, **match}
    match = {**match, "enc": codec}
    stages: list[dict[str, Any]] = [{"$match": match}]
    stages += list(pipeline or [])
    stages.append({"$project": {f: 1 for f in BUCKET_FIELDS}})
    options = (read or ReadOptions()).reader_options(expected_docs, spark.sparkContext.defaultParallelism,
                                                     expected_bytes)
    documents = codec == DOCUMENT_CODEC and payload_schema is not None
    return (
        spark.read.format("mongodb")
        .schema(bucket_schema(payload_schema) if documents else BUCKET_SCHEMA)  # type: ignore[arg-type]
        .option("connection.uri", uri)
        .option("database", database)
        .option("collection", queue)
        .option("aggregation.pipeline", json_util.dumps(stages))  # extended JSON: ObjectIds as {"$oid": ...}
        .options(**options)
        .load()
    )


def bucket_schema(payload_schema: str | StructType) -> StructType:
    """``BUCKET_SCHEMA`` for ``bson`` buckets: ``p`` as an array of ``payload_schema`` structs."""
    from pyspark.sql.types import ArrayType, DataType, StructField, StructType

    bucket = DataType.fromDDL(BUCKET_SCHEMA)
    assert isinstance(bucket, StructType)  # BUCKET_SCHEMA is a struct's DDL
    return StructType([StructField("p", ArrayType(payload_struct(payload_schema))) if f.name == "p" else f
                       for f in bucket.fields])


def payload_struct(payload_schema: str | StructType) -> StructType:
    """The payload schema as a ``StructType`` (a DDL string is parsed by Spark: a session must be active).
    Raises ``InvalidOption`` for anything but a struct, or one using the reader's ``CORRUPT_FIELD``."""
    from pyspark.sql.types import DataType, StructType

    try:
        schema = DataType.fromDDL(payload_schema) if isinstance(payload_schema, str) else payload_schema
    except Exception as exc:  # Spark's ParseException, whose message names the position
        raise InvalidOption(f"payload_schema {payload_schema!r} does not parse: {str(exc).splitlines()[0]}") from exc
    if not isinstance(schema, StructType):
        raise InvalidOption(f"payload_schema must be a struct (fields of a JSON object), got {schema!r}")
    if CORRUPT_FIELD in schema.fieldNames():
        raise InvalidOption(f"payload_schema may not have a field named {CORRUPT_FIELD!r} (the reader's own)")
    return schema


def decode_options(json_options: Mapping[str, str] | None) -> dict[str, str]:
    """``from_json`` options: the caller's, then PERMISSIVE mode with ``CORRUPT_FIELD``. Raises ``InvalidOption``
    if the caller sets one of ``RESERVED_JSON_OPTIONS`` (Spark's option names ignore case)."""
    options = {k: str(v) for k, v in (json_options or {}).items()}
    reserved = sorted(k for k in options if k.lower() in {r.lower() for r in RESERVED_JSON_OPTIONS})
    if reserved:
        raise InvalidOption(f"json_options may not set {', '.join(reserved)}: malformed payloads are flagged in "
                            "the 'malformed' column (the batch job's malformed= chooses quarantine or failure)")
    return {**options, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_FIELD}


def explode_messages(buckets: DataFrame, payload_schema: str | StructType,
                     json_options: Mapping[str, str] | None = None) -> DataFrame:
    """One row per unfinished message of ``buckets`` (rows of ``BUCKET_SCHEMA``, or of ``bucket_schema`` for
    ``bson`` buckets), columns ``MESSAGE_COLUMNS``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = payload_struct(payload_schema)
    options = decode_options(json_options)
    unfinished = buckets.selectExpr("*", "posexplode(p) AS (slot, raw)").where(UNFINISHED_SQL)
    if isinstance(buckets.schema["p"].dataType.elementType, StructType):  # type: ignore[attr-defined]
        # bson buckets read with their payload schema: the connector made the structs (or failed the read)
        return unfinished.selectExpr(*MESSAGE_SQL, "raw AS payload", "raw IS NULL AS malformed")
    # Each payload is decoded once, as the input of a generator over one element: `decoded` is then the generator's
    # output, which the optimizer cannot inline. (From a projection, it copies from_json into every use of
    # `decoded`, and into any filter on `malformed` pushed below it: three or four parses a payload.)
    with_corrupt = StructType([*schema.fields, StructField(CORRUPT_FIELD, StringType())])
    decoded = unfinished.select("*", F.explode(F.array(F.from_json("raw", with_corrupt, options))).alias("decoded"))
    parsed = F.col("decoded")
    return decoded.select(*map(F.expr, MESSAGE_SQL), parsed.dropFields(CORRUPT_FIELD).alias("payload"),
                          (parsed.isNull() | parsed[CORRUPT_FIELD].isNotNull()).alias("malformed"))


def read_messages(spark: SparkSession, uri: str, database: str, queue: str, payload_schema: str | StructType, *,
                  token: str | None = None, ids: Sequence[Any] | None = None, expected_docs: int | None = None,
                  read: ReadOptions | None = None, json_options: Mapping[str, str] | None = None,
                  expected_bytes: int | None = None, codec: str = "json", as_json: bool = False) -> DataFrame:
    """``read_buckets`` then ``explode_messages``. ``as_json`` reads ``bson`` payloads as JSON text, the slower
    path that flags each payload that does not fit instead of failing the read."""
    buckets = read_buckets(spark, uri, database, queue, token=token, ids=ids, expected_docs=expected_docs,
                           read=read, expected_bytes=expected_bytes, codec=codec,
                           payload_schema=None if as_json else payload_schema)
    return explode_messages(buckets, payload_schema, json_options)

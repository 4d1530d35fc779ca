"""Idempotent sinks: writing the same batch twice (a re-run after a crash before the commit) stores it once.

A re-run claims the crashed batch's buckets again after their lease expired, under a new token and possibly
together with other buckets, so a sink keyed by the batch (its token or its set of buckets) would keep the
first attempt's rows next to the second's. Both sinks are therefore keyed by what stays the same across runs:

* ``ParquetSink``: output partitioned by ``bucket_id`` and written with *dynamic* partition overwrite, so a
  write replaces exactly the ``bucket_id=<hex>`` directories present in its rows and leaves all others alone.
  The rows of one bucket must depend only on that bucket's messages: keep ``bucket_id`` in the result, and
  aggregate per bucket (partial aggregates; roll up when reading, see ``spark/jobs/account_totals.py``).
* ``MongoSink``: ``_id`` derived from ``id_columns`` (default ``message_id``; e.g. ``("bucket_id", "account")``
  for per-bucket aggregates) and written with ``operationType=replace, upsertDocument=true``: a row written
  again replaces its earlier copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from bucketq.shell.connection import check_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Sink(Protocol):
    def write(self, df: DataFrame) -> None: ...


@dataclass(frozen=True)
class ParquetSink:
    """Parquet under ``path``, one ``<partition_column>=<value>`` directory per bucket, replaced on rewrite.
    ``one_file_per_bucket`` shuffles rows by bucket first so that each directory gets a single file."""

    path: str
    partition_column: str = "bucket_id"
    one_file_per_bucket: bool = True
    options: Mapping[str, str] = field(default_factory=dict)

    def write(self, df: DataFrame) -> None:
        if self.partition_column not in df.columns:
            raise ValueError(f"the result must keep the {self.partition_column!r} column: the Parquet sink "
                             "replaces output per bucket, which is what makes a re-run write no duplicates")
        if self.one_file_per_bucket:
            df = df.repartition(self.partition_column)
        (df.write.mode("overwrite")
         .option("partitionOverwriteMode", "dynamic")
         .options(**self.options)
         .partitionBy(self.partition_column)
         .parquet(str(self.path)))

    def read(self, spark: SparkSession) -> DataFrame:
        """Everything written so far, the partition column read as a string (a bucket id of only decimal
        digits would otherwise be inferred as a number)."""
        from pyspark.sql.types import StringType, StructField, StructType

        inferred = spark.read.parquet(str(self.path)).schema
        fields = [f for f in inferred.fields if f.name != self.partition_column]
        schema = StructType([*fields, StructField(self.partition_column, StringType())])
        return spark.read.schema(schema).parquet(str(self.path))


@dataclass(frozen=True)
class MongoSink:
    """A MongoDB collection written through the connector, upserting by an ``_id`` made of ``id_columns``
    (one column: its value; several: a sub-document of them, in order)."""

    uri: str = field(repr=False)  # shown only redacted
    database: str
    collection: str
    id_columns: Sequence[str] = ("message_id",)
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_uri(self.uri)

    def write(self, df: DataFrame) -> None:
        from pyspark.sql import functions as F

        missing = [c for c in self.id_columns if c not in df.columns]
        if missing or not self.id_columns:
            raise ValueError(f"the result lacks the id column(s) {missing or '(none given)'} of the Mongo sink")
        if list(self.id_columns) != ["_id"]:
            key = F.col(self.id_columns[0]) if len(self.id_columns) == 1 else F.struct(*self.id_columns)
            df = df.withColumn("_id", key)
        (df.write.format("mongodb")
         .mode("append")
         .option("connection.uri", self.uri)
         .option("database", self.database)
         .option("collection", self.collection)
         .option("operationType", "replace")
         .option("idFieldList", "_id")
         .option("upsertDocument", "true")
         .options(**self.options)
         .save())

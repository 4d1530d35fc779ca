"""Spark over a bucketq stream: read a range of positions through the connector, and run a reader group's
uncommitted range as a batch: read -> process -> write the sink (idempotent, keyed by position) -> commit.

The commit comes after the sink write and only moves the group from the position the batch started at (same
epoch): a job killed between the write and the commit leaves the group where it was, so the next run reads the
same range and rewrites the same rows (keyed by ``position``, they replace themselves). Nothing is skipped,
nothing duplicated in the sink. A group read by Spark jobs should not also have ``Stream.reader``s: those share
work through claims, which a batch does not take (two jobs at once on one group are harmless: both write the
same rows, one commit applies).

The message columns (``STREAM_MESSAGE_COLUMNS``):

    position  STRING     ``"<sequence>:<slot>"``, the message's position (the sink's key)
    seq       LONG       its bucket's sequence
    slot      INT        its index in the bucket
    created   TIMESTAMP  when its bucket was opened
    key       STRING     the key given to ``push``, or null
    headers   STRING     the headers document as JSON, or null
    payload   STRUCT     ``from_json(p[slot], payload_schema)``
    malformed BOOLEAN    the payload does not parse with the schema
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bucketq.clock import ServerClock
from bucketq.connection import check_uri, client_of, reaching
from bucketq.core import stream as core
from bucketq.core.claims import owner_name
from bucketq.core.stream import GroupState, HoleWatch, Position
from bucketq.store.sync.stream import StreamStore
from bucketq_spark.reader import CORRUPT_FIELD, ReadOptions, decode_options, payload_struct
from bucketq_spark.session import require_connector
from bucketq_spark.sinks import Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

STREAM_BUCKET_SCHEMA = "_id LONG, created TIMESTAMP, p ARRAY<STRING>, h ARRAY<STRING>, k ARRAY<STRING>"
STREAM_MESSAGE_COLUMNS = ("position", "seq", "slot", "created", "key", "headers", "payload", "malformed")


def read_stream_range(spark: SparkSession, uri: str, database: str, stream: str, payload_schema: str | StructType,
                      *, start: Position, end: Position, read: ReadOptions | None = None,
                      json_options: Mapping[str, str] | None = None) -> DataFrame:
    """The messages of ``stream`` with ``start <= position < end``, one row each (``STREAM_MESSAGE_COLUMNS``).
    The connector runs ``$match`` on the sequences; the slots of the first and last bucket are cut here."""
    check_uri(uri)  # before the connector could echo it
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    last_seq = end.seq if end.slot else end.seq - 1
    stages = [{"$match": {"_id": {"$gte": start.seq, "$lte": last_seq}, "gap": {"$ne": True}}},
              {"$project": {"created": 1, "p": 1, "h": 1, "k": 1}}]
    options = (read or ReadOptions()).reader_options(max(1, last_seq - start.seq + 1),
                                                     spark.sparkContext.defaultParallelism)
    buckets = (spark.read.format("mongodb").schema(STREAM_BUCKET_SCHEMA)
               .option("connection.uri", uri).option("database", database).option("collection", stream)
               .option("aggregation.pipeline", json.dumps(stages)).options(**options).load())
    schema = payload_struct(payload_schema)
    with_corrupt = StructType([*schema.fields, StructField(CORRUPT_FIELD, StringType())])
    seq, slot = F.col("_id"), F.col("slot")
    exploded = buckets.select("*", F.posexplode("p").alias("slot", "raw")).where(
        ((seq > start.seq) | (slot >= start.slot)) & ((seq < end.seq) | (slot < end.slot)))
    # decoded once, as a generator's output (see bucketq_spark.reader.explode_messages)
    decoded = exploded.select("*", F.explode(F.array(F.from_json("raw", with_corrupt, decode_options(json_options))))
                              .alias("decoded"))
    payload = F.col("decoded")
    return decoded.select(
        F.concat_ws(":", seq.cast("string"), slot.cast("string")).alias("position"),
        seq.alias("seq"),
        slot,
        F.col("created"),
        F.get("k", slot).alias("key"),
        F.get("h", slot).alias("headers"),
        payload.dropFields(CORRUPT_FIELD).alias("payload"),
        (payload.isNull() | payload[CORRUPT_FIELD].isNotNull()).alias("malformed"),
    )


@dataclass(frozen=True)
class GroupRange:
    """What a group has not committed, as far as it can be read now: ``start <= position < end``."""

    group: GroupState
    end: Position

    @property
    def start(self) -> Position:
        return self.group.committed

    @property
    def empty(self) -> bool:
        return self.end <= self.start


def uncommitted_range(database: Any, stream: str, group: str, *, start: str = "beginning",
                      max_buckets: int = core.SCAN_BUCKETS, gap_wait: float = 35.0, poll: float = 0.2) -> GroupRange:
    """The group's range from its committed position up to the first sequence not stored yet, at most
    ``max_buckets`` buckets (a pymongo ``Database``, or ``bucketq.memory``'s ``SyncDatabase``; the group is
    created at ``start``, "beginning" or "end", if missing). A hole (an allocated sequence missing) ends the
    range; when it is the range's first sequence, this waits up to ``gap_wait`` seconds for it to land and then
    marks it a gap (docs/FORMAT.md, the hole rule). Every command goes through the generated synchronous
    ``StreamStore``, the stream readers' own."""
    clock = ServerClock()
    clock.sync_blocking(database)
    store = StreamStore(database, stream)
    last, floor = store.counter_state()
    first = Position(floor if start == "beginning" else last + 1)
    holes = HoleWatch(gap_wait)
    while True:
        while (state := store.group(group)) is None:  # missing, or deleted meanwhile: join it
            store.upsert_group(*core.join_group(group, first, clock.now()))
        begin = max(state.committed.seq, floor)
        present = [d["_id"] for d in store.window(begin, max_buckets)]
        end = core.advance(begin, present, present)
        last = store.counter_state()[0]
        if end > begin or end > last:  # something to read, or nothing allocated beyond
            return GroupRange(state, Position(end) if end > begin else state.committed)
        if holes.due([end], time.monotonic()):
            store.mark_gap(end, clock.now(), owner_name())  # or the producer's bucket landed after all
            continue
        time.sleep(poll)


def commit_range(database: Any, stream: str, taken: GroupRange) -> bool:
    """Move the group past ``taken``: only from where the batch started, within its epoch. False when it
    moved meanwhile (a reset, another job's commit): nothing is changed then."""
    clock = ServerClock()
    clock.sync_blocking(database)
    query, update = core.commit(taken.group, taken.end.seq, clock.now())
    query.update({"s": taken.start.seq, "i": taken.start.slot})
    return StreamStore(database, stream).move_group(query, update)


def run_group_batch(spark: SparkSession, uri: str, database: str, stream: str, group: str,
                    payload_schema: str | StructType, process: Callable[[DataFrame], DataFrame], sink: Sink, *,
                    start: str = "beginning", max_buckets: int = core.SCAN_BUCKETS, gap_wait: float = 35.0,
                    read: ReadOptions | None = None, before_commit: Callable[[], None] | None = None
                    ) -> dict[str, Any]:
    """One batch of ``group``: its uncommitted range read, ``process``ed, written to ``sink`` (which must be
    idempotent by ``position``, e.g. ``MongoSink(..., id_columns=("position",))``), then committed.
    ``before_commit`` runs between the write and the commit (tests inject a crash there). Returns
    ``{"start", "end", "rows", "committed"}``."""
    from pymongo import MongoClient

    client: MongoClient = client_of(uri, MongoClient)
    try:
        db = client[database]
        with reaching(uri, f"reading the range of group {group!r}"):
            taken = uncommitted_range(db, stream, group, start=start, max_buckets=max_buckets, gap_wait=gap_wait)
        if taken.empty:
            return {"start": str(taken.start), "end": str(taken.end), "rows": 0, "committed": False}
        require_connector(spark)  # the read would fail too, before the commit: this says why, clearly
        frame = read_stream_range(spark, uri, database, stream, payload_schema, start=taken.start, end=taken.end,
                                  read=read)
        result = process(frame).cache()
        try:
            rows = result.count()
            sink.write(result)
        finally:
            result.unpersist()
        if before_commit is not None:
            before_commit()
        committed = commit_range(db, stream, taken)
        return {"start": str(taken.start), "end": str(taken.end), "rows": rows, "committed": committed}
    finally:
        client.close()

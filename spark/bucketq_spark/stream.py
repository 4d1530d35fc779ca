"""Spark over a bucketq stream: read a range of positions through the connector, and run a reader group's
uncommitted range as a batch: read -> process -> write the sink (idempotent, keyed by position) -> commit.

The commit comes after the sink write and only moves the group from the position the batch started at (same
epoch): a job killed between the write and the commit leaves the group where it was, so the next run reads the
same range and rewrites the same rows (keyed by ``position``, they replace themselves). Nothing is skipped,
nothing duplicated in the sink. A group read by Spark jobs should not also have ``Stream.reader``s: those share
work through claims, which a batch does not take (two jobs at once on one group are harmless: both write the
same rows, one commit applies).

In a partitioned stream (docs/FORMAT.md, Partitions) a batch takes each partition's uncommitted range, reads
each through its own connector read (a ``$match`` that pins the partition: one targeted read per partition, at
least one Spark partition each), writes their union, and commits each partition's range on its own.

The message columns (``STREAM_MESSAGE_COLUMNS``):

    position  STRING     ``"[<partition>/]<sequence>:<slot>"``, the message's position (the sink's key)
    partition INT        its partition (0 in a stream of one)
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

from bucketq.core import reader_groups, stream_read
from bucketq.core.claims import owner_name
from bucketq.core.conversation import carry
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition, Position
from bucketq.core.stream_gaps import HoleWatch
from bucketq.errors import InvalidOption
from bucketq.shell.clock import ServerClock
from bucketq.shell.connection import check_uri, client_of, reaching
from bucketq.store.sync.stream_store import StreamStore
from bucketq_spark.reader import CORRUPT_FIELD, ReadOptions, decode_options, payload_struct
from bucketq_spark.session import require_connector
from bucketq_spark.sinks import Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

STREAM_BUCKET_FIELDS = "created TIMESTAMP, p ARRAY<STRING>, h ARRAY<STRING>, k ARRAY<STRING>"
STREAM_MESSAGE_COLUMNS = ("position", "partition", "seq", "slot", "created", "key", "headers", "payload",
                          "malformed")


def read_stream_range(spark: SparkSession, uri: str, database: str, stream: str, payload_schema: str | StructType,
                      *, start: Position, end: Position, partitions: int = 1, read: ReadOptions | None = None,
                      json_options: Mapping[str, str] | None = None) -> DataFrame:
    """The messages of ``stream`` with ``start <= position < end``, one row each (``STREAM_MESSAGE_COLUMNS``),
    in the partition both name, of a stream of ``partitions``. The connector runs ``$match`` on the partition's
    sequences; the slots of the first and last bucket are cut here."""
    check_uri(uri)  # before the connector could echo it
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if start.partition != end.partition or start.partition >= partitions:
        raise InvalidOption(f"a range is within one partition of the {partitions}, got {start} to {end}")
    part = Partition(start.partition, partitions)
    last_seq = end.seq if end.slot else end.seq - 1
    stages = [{"$match": {**part.seqs({"$gte": start.seq, "$lte": last_seq}), "gap": {"$ne": True}}},
              {"$project": {part.seq_field: 1, "created": 1, "p": 1, "h": 1, "k": 1}}]
    options = (read or ReadOptions()).reader_options(max(1, last_seq - start.seq + 1),
                                                     spark.sparkContext.defaultParallelism)
    schema_ddl = f"{'s' if part.partitioned else '_id'} LONG, {STREAM_BUCKET_FIELDS}"
    buckets = (spark.read.format("mongodb").schema(schema_ddl)
               .option("connection.uri", uri).option("database", database).option("collection", stream)
               .option("aggregation.pipeline", json.dumps(stages)).options(**options).load())
    schema = payload_struct(payload_schema)
    with_corrupt = StructType([*schema.fields, StructField(CORRUPT_FIELD, StringType())])
    seq, slot = F.col(part.seq_field), F.col("slot")
    exploded = buckets.select("*", F.posexplode("p").alias("slot", "raw")).where(
        ((seq > start.seq) | (slot >= start.slot)) & ((seq < end.seq) | (slot < end.slot)))
    # decoded once, as a generator's output (see bucketq_spark.reader.explode_messages)
    decoded = exploded.select("*", F.explode(F.array(F.from_json("raw", with_corrupt, decode_options(json_options))))
                              .alias("decoded"))
    payload = F.col("decoded")
    label = [F.lit(f"{part.number}/")] if part.number else []
    return decoded.select(
        F.concat(*label, seq.cast("string"), F.lit(":"), slot.cast("string")).alias("position"),
        F.lit(part.number).alias("partition"),
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
    """What a group has not committed in one partition, as far as it can be read now: ``start <= position <
    end``."""

    group: ReaderGroup
    part: Partition
    end: Position

    @property
    def start(self) -> Position:
        return self.group.at(self.part)

    @property
    def empty(self) -> bool:
        return self.end <= self.start


def uncommitted_ranges(database: Any, stream: str, group: str, *, start: str = "beginning",
                       max_buckets: int = reader_groups.SCAN_BUCKETS, gap_wait: float = 35.0,
                       poll: float = 0.2) -> list[GroupRange]:
    """The group's range in each partition, from its committed position up to the first sequence not stored yet,
    at most ``max_buckets`` buckets (a pymongo ``Database``, or ``bucketq.memory``'s ``SyncDatabase``; the group
    is created at ``start``, "beginning" or "end", if missing). A hole (an allocated sequence missing) ends the
    range; when it is the range's first sequence, this waits up to ``gap_wait`` seconds for it to land and then
    marks it a gap (docs/FORMAT.md, the hole rule). Every command goes through the generated synchronous
    ``StreamStore``, the stream readers' own."""
    clock = ServerClock()
    clock.sync_blocking(database)
    store = StreamStore(database, stream)
    parts = store.open()
    counters = store.counters()
    first = [Position(floor if start == "beginning" else last + 1, 0, pt) for pt, (last, floor) in counters.items()]

    def execute(step: stream_read.ReadStep) -> Any:
        match step:
            case stream_read.ReadGroup():
                return store.group(group)
            case stream_read.StartPositions():
                return first
            case stream_read.ReadClock():
                return clock.now()
            case stream_read.ReadMonotonic():
                return time.monotonic()
            case stream_read.UpsertGroup(query, update):
                return store.upsert_group(query, update)
            case stream_read.MoveGroup(query, update):
                return store.move_group(query, update)
            case stream_read.ReadWindow(part, begin, size):
                return store.window(part, begin, size)
            case stream_read.ReadCounter(part):
                return store.counter_state(part)
            case stream_read.MarkGap(part, seq):
                return store.mark_gap(part, seq, clock.now(), owner_name())
            case stream_read.WaitForHole():
                return time.sleep(poll)
        raise AssertionError(f"a batch takes no step {step!r}")

    ranges = []
    for part in parts:
        state, end = carry(stream_read.uncommitted(group, parts, part, counters[part.number][1], max_buckets,
                                                   HoleWatch(gap_wait)), execute)
        ranges.append(GroupRange(state, part, end))
    return ranges


def uncommitted_range(database: Any, stream: str, group: str, **options: Any) -> GroupRange:
    """``uncommitted_ranges`` of a stream of one partition; ``InvalidOption`` for a partitioned stream."""
    ranges = uncommitted_ranges(database, stream, group, **options)
    if len(ranges) != 1:
        raise InvalidOption(f"stream {stream!r} has {len(ranges)} partitions: take uncommitted_ranges")
    return ranges[0]


def commit_range(database: Any, stream: str, taken: GroupRange) -> bool:
    """Move the group past ``taken`` in its partition: only from where the batch started, within its epoch.
    False when it moved meanwhile (a reset, another job's commit): nothing is changed then."""
    clock = ServerClock()
    clock.sync_blocking(database)
    query, update = reader_groups.commit(taken.group, taken.part, taken.end.seq, clock.now())
    query.update({taken.part.group_field("s"): taken.start.seq, taken.part.group_field("i"): taken.start.slot})
    return StreamStore(database, stream).move_group(query, update)


def run_group_batch(spark: SparkSession, uri: str, database: str, stream: str, group: str,
                    payload_schema: str | StructType, process: Callable[[DataFrame], DataFrame], sink: Sink, *,
                    start: str = "beginning", max_buckets: int = reader_groups.SCAN_BUCKETS, gap_wait: float = 35.0,
                    read: ReadOptions | None = None, before_commit: Callable[[], None] | None = None
                    ) -> dict[str, Any]:
    """One batch of ``group``: its uncommitted range read, ``process``ed, written to ``sink`` (which must be
    idempotent by ``position``, e.g. ``MongoSink(..., id_columns=("position",))``), then committed: in a
    partitioned stream, the ranges of every partition with something to read, one read each, committed each.
    ``before_commit`` runs between the write and the commit (tests inject a crash there). Returns
    ``{"start", "end", "rows", "committed"}`` (positions of several partitions separated by spaces;
    ``committed``: every partition's commit applied)."""
    from pymongo import MongoClient

    client: MongoClient = client_of(uri, MongoClient)
    try:
        db = client[database]
        with reaching(uri, f"reading the range of group {group!r}", client=client):
            ranges = uncommitted_ranges(db, stream, group, start=start, max_buckets=max_buckets, gap_wait=gap_wait)
        bounds = {"start": " ".join(str(r.start) for r in ranges), "end": " ".join(str(r.end) for r in ranges)}
        taken = [r for r in ranges if not r.empty]
        if not taken:
            return {**bounds, "rows": 0, "committed": False}
        require_connector(spark)  # the read would fail too, before the commit: this says why, clearly
        frames = [read_stream_range(spark, uri, database, stream, payload_schema, start=r.start, end=r.end,
                                    partitions=len(ranges), read=read) for r in taken]
        frame = frames[0]
        for more in frames[1:]:
            frame = frame.unionByName(more)
        result = process(frame).cache()
        try:
            rows = result.count()
            sink.write(result)
        finally:
            result.unpersist()
        if before_commit is not None:
            before_commit()
        committed = [commit_range(db, stream, r) for r in taken]
        return {**bounds, "rows": rows, "committed": all(committed)}
    finally:
        client.close()

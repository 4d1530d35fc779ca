"""Spark over a stream: a range of positions read through the connector, and a group's uncommitted
range run as a batch whose commit follows the sink write, with a crash injected between the two."""

from __future__ import annotations

import pytest

import bucketq
from bucketq import Position

pytestmark = pytest.mark.spark

SCHEMA = "i LONG"


class Crash(Exception):
    pass


async def _push(mongo_uri: str, db_name: str, start: int, n: int) -> list[Position]:
    async with bucketq.Stream(mongo_uri, name="events", db=db_name, bucket_max_size=4) as stream:
        positions = []
        for i in range(start, start + n, 4):
            positions += await stream.push_many([{"i": j} for j in range(i, min(i + 4, start + n))])
        return positions


async def test_a_range_of_positions(spark, mongo_uri, db_name, sync_db) -> None:
    from bucketq_spark.stream import STREAM_MESSAGE_COLUMNS, read_stream_range

    positions = await _push(mongo_uri, db_name, 0, 30)
    start, end = Position(2, 1), Position(5, 2)
    frame = read_stream_range(spark, mongo_uri, db_name, "events", SCHEMA, start=start, end=end)
    assert tuple(frame.columns) == STREAM_MESSAGE_COLUMNS
    rows = sorted(frame.collect(), key=lambda r: (r.seq, r.slot))
    expected = [p for p in positions if start <= p < end]
    assert [r.position for r in rows] == [str(p) for p in expected]
    assert [r.payload.i for r in rows] == [positions.index(p) for p in expected]
    assert not any(r.malformed for r in rows)


async def test_group_batch_commits_after_the_sink_and_a_crash_between_rewrites_the_same_rows(
        spark, mongo_uri, db_name, sync_db) -> None:
    from bucketq_spark.sinks import MongoSink
    from bucketq_spark.stream import run_group_batch

    await _push(mongo_uri, db_name, 0, 20)
    sink = MongoSink(mongo_uri, db_name, "sink", id_columns=("position",))

    def process(frame):
        return frame.select("position", "seq", "slot", "payload.i")

    def crash() -> None:
        raise Crash("killed between the sink write and the commit")

    with pytest.raises(Crash):
        run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA, process, sink, before_commit=crash)
    assert sync_db["sink"].count_documents({}) == 20
    assert sync_db["events.positions"].find_one({"_id": "spark"})["s"] == 1  # not committed

    again = run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA, process, sink, max_buckets=3)
    assert again == {"start": "1:0", "end": "4:0", "rows": 12, "committed": True}
    rest = run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA, process, sink)
    assert rest == {"start": "4:0", "end": "6:0", "rows": 8, "committed": True}
    assert run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA, process, sink)["rows"] == 0

    await _push(mongo_uri, db_name, 20, 5)
    assert run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA, process, sink)["rows"] == 5
    stored = list(sync_db["sink"].find())
    assert len(stored) == 25 and sorted(d["i"] for d in stored) == list(range(25))
    assert {d["_id"] for d in stored} == {f"{d['seq']}:{d['slot']}" for d in stored}


async def test_a_hole_at_the_start_of_the_range_becomes_a_gap_after_gap_wait(spark, mongo_uri, db_name,
                                                                             sync_db) -> None:
    from bucketq.core.stream_format import COUNTER_ID
    from bucketq_spark.sinks import MongoSink
    from bucketq_spark.stream import run_group_batch

    await _push(mongo_uri, db_name, 0, 4)
    sync_db["events.seq"].update_one({"_id": COUNTER_ID}, {"$inc": {"last": 1}})  # a producer killed: hole at 2
    await _push(mongo_uri, db_name, 4, 4)
    sink = MongoSink(mongo_uri, db_name, "sink", id_columns=("position",))

    def process(frame):
        return frame.select("position", "payload.i")

    first = run_group_batch(spark, mongo_uri, db_name, "events", "g", SCHEMA, process, sink, gap_wait=0.5)
    assert first == {"start": "1:0", "end": "2:0", "rows": 4, "committed": True}  # stops before the hole
    second = run_group_batch(spark, mongo_uri, db_name, "events", "g", SCHEMA, process, sink, gap_wait=0.5)
    assert second == {"start": "2:0", "end": "4:0", "rows": 4, "committed": True}
    assert sync_db["events"].find_one({"_id": 2})["gap"] is True
    assert sorted(d["i"] for d in sync_db["sink"].find()) == list(range(8))


async def test_a_partitioned_stream_is_read_one_targeted_read_per_partition_and_committed_per_partition(
        spark, mongo_uri, db_name, sync_db) -> None:
    from bucketq_spark.sinks import MongoSink
    from bucketq_spark.stream import read_stream_range, run_group_batch

    async with bucketq.Stream(mongo_uri, name="events", db=db_name, bucket_max_size=4, partitions=3) as stream:
        positions = []
        for i in range(0, 24, 4):  # six writes: two buckets in each partition
            positions += await stream.push_many([{"i": j} for j in range(i, i + 4)])
    one = [p for p in positions if p.partition == 2]
    frame = read_stream_range(spark, mongo_uri, db_name, "events", SCHEMA, start=one[1], end=Position(3, 0, 2),
                              partitions=3)
    rows = sorted(frame.collect(), key=lambda r: (r.seq, r.slot))
    assert [r.position for r in rows] == [str(p) for p in one[1:]] and {r.partition for r in rows} == {2}
    assert [r.payload.i for r in rows] == [positions.index(p) for p in one[1:]]

    sink = MongoSink(mongo_uri, db_name, "sink", id_columns=("position",))
    batch = run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA,
                            lambda f: f.select("position", "partition", "payload.i"), sink)
    assert batch == {"start": "1:0 1/1:0 2/1:0", "end": "3:0 1/3:0 2/3:0", "rows": 24, "committed": True}
    stored = list(sync_db["sink"].find())
    assert sorted(d["i"] for d in stored) == list(range(24)) and {d["_id"] for d in stored} == set(map(str, positions))
    assert sync_db["events.positions"].find_one({"_id": "spark"})["s"] == [3, 3, 3]
    assert run_group_batch(spark, mongo_uri, db_name, "events", "spark", SCHEMA, lambda f: f, sink)["rows"] == 0

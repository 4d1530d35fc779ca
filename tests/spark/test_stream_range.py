"""The Spark stream shell's range logic without Spark (``bucketq_spark.stream``: ``uncommitted_range`` and
``commit_range``), on both backends: pymongo's synchronous ``Database`` on the test server, and
``bucketq.memory``'s ``SyncDatabase`` (no JVM), through the generated synchronous ``StreamStore``. The reads
through the connector are tests/spark/test_stream_spark.py's."""

from __future__ import annotations

from typing import Any

import pytest

import bucketq
from bucketq.core.stream_format import COUNTER_ID
from bucketq_spark.stream import commit_range, uncommitted_range, uncommitted_ranges

pytestmark = pytest.mark.backends("memory", "server")


async def _push(target: Any, db_name: str, n: int) -> None:
    """``n`` messages, four to a bucket."""
    async with bucketq.Stream(target, name="events", db=db_name, bucket_max_size=4) as stream:
        for i in range(0, n, 4):
            await stream.push_many(list(range(i, min(i + 4, n))))


def _bounds(taken: Any) -> tuple[str, str]:
    return str(taken.start), str(taken.end)


async def test_a_range_stops_at_a_hole_marks_it_a_gap_after_gap_wait_and_commits_once(queue_target, db_name,
                                                                                      sync_db) -> None:
    await _push(queue_target, db_name, 4)
    sync_db["events.seq"].update_one({"_id": COUNTER_ID}, {"$inc": {"last": 1}})  # a producer killed: hole at 2
    await _push(queue_target, db_name, 8)

    first = uncommitted_range(sync_db, "events", "g", gap_wait=0.3, poll=0.02)
    assert _bounds(first) == ("1:0", "2:0")  # stops before the hole, which has not waited gap_wait yet
    assert sync_db.events.find_one({"_id": 2}) is None
    assert commit_range(sync_db, "events", first)
    assert not commit_range(sync_db, "events", first), "a second commit of one range moved the group again"

    second = uncommitted_range(sync_db, "events", "g", gap_wait=0.3, poll=0.02)
    assert _bounds(second) == ("2:0", "5:0")  # the hole became a gap marker; the two buckets after it follow
    assert sync_db.events.find_one({"_id": 2})["gap"] is True
    assert commit_range(sync_db, "events", second)
    rest = uncommitted_range(sync_db, "events", "g", gap_wait=0.3, poll=0.02)
    assert rest.empty and _bounds(rest) == ("5:0", "5:0")
    assert sync_db["events.positions"].find_one({"_id": "g"})["s"] == 5


async def test_a_group_reset_after_its_range_was_taken_refuses_the_commit(queue_target, db_name, sync_db) -> None:
    await _push(queue_target, db_name, 8)
    taken = uncommitted_range(sync_db, "events", "g")
    assert _bounds(taken) == ("1:0", "3:0")
    async with bucketq.Stream(queue_target, name="events", db=db_name) as stream:
        await stream.reset("g", bucketq.Position(2, 1))  # an operator replays from 2:1 meanwhile
    assert not commit_range(sync_db, "events", taken)
    group = sync_db["events.positions"].find_one({"_id": "g"})
    assert (group["s"], group["i"]) == (2, 1)
    again = uncommitted_range(sync_db, "events", "g")
    assert _bounds(again) == ("2:1", "3:0")


async def test_a_group_created_at_the_end_has_nothing_to_read_until_a_push(queue_target, db_name, sync_db) -> None:
    await _push(queue_target, db_name, 4)
    assert uncommitted_range(sync_db, "events", "late", start="end").empty
    await _push(queue_target, db_name, 4)
    assert _bounds(uncommitted_range(sync_db, "events", "late", start="end")) == ("2:0", "3:0")


async def test_a_partitioned_stream_has_one_range_per_partition_each_committed_on_its_own(queue_target, db_name,
                                                                                         sync_db) -> None:
    async with bucketq.Stream(queue_target, name="events", db=db_name, bucket_max_size=4, partitions=3) as stream:
        for i in range(0, 20, 4):  # five writes of one bucket: two partitions get two, one gets one
            await stream.push_many(list(range(i, i + 4)))
    with pytest.raises(bucketq.InvalidOption, match="uncommitted_ranges"):
        uncommitted_range(sync_db, "events", "g")
    ranges = uncommitted_ranges(sync_db, "events", "g")
    assert [r.part.number for r in ranges] == [0, 1, 2]
    assert sorted(r.end.seq for r in ranges) == [2, 3, 3] and all(r.start.seq == 1 for r in ranges)
    assert [str(r.start) for r in ranges] == ["1:0", "1/1:0", "2/1:0"]
    assert commit_range(sync_db, "events", ranges[1])
    assert not commit_range(sync_db, "events", ranges[1]), "a second commit of one range moved the group again"
    again = uncommitted_ranges(sync_db, "events", "g")
    assert again[1].empty and again[1].start == ranges[1].end
    assert [r.start for r in again[::2]] == [r.start for r in ranges[::2]]  # the others stay
    assert sync_db["events.positions"].find_one({"_id": "g"})["s"] == [1, ranges[1].end.seq, 1]

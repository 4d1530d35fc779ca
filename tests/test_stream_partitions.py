"""Partitioned streams: ``partitions=N`` makes a stream N independent sequences. Pushes spread over
them, every group reads every message once, order holds within a partition, and the rules of one sequence (the
hole rule, a killed reader's redelivery, retention) hold in each partition on its own. A version-1 stream (one
partition) keeps its format and refuses to become partitioned."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest

import bucketq
from bucketq import Position
from bucketq.core.stream_format import LAYOUT_ID
from tests.helpers import eventually, no_background_housekeeping, read_all, read_together

pytestmark = pytest.mark.backends("memory", "server")


@pytest.fixture
def make_stream(make_stream: Callable[..., bucketq.Stream]) -> Callable[..., bucketq.Stream]:
    """conftest's, with four partitions unless a test asks for another count."""
    return functools.partial(make_stream, partitions=4)


async def push_writes(stream: bucketq.Stream, writes: int, per_write: int = 3) -> list[Position]:
    """``writes`` writes of ``per_write`` messages (one bucket each), numbered from 0: each goes to the next
    partition."""
    positions = []
    for w in range(writes):
        positions += await stream.push_many(range(w * per_write, (w + 1) * per_write))
    return positions


async def test_pushes_spread_over_the_partitions_and_each_group_reads_every_message_once_in_partition_order(
        make_stream, sync_db):
    stream = make_stream()
    positions = await push_writes(stream, 8)
    per_partition = Counter(p.partition for p in positions)
    assert sorted(per_partition) == [0, 1, 2, 3] and set(per_partition.values()) == {6}  # two writes each
    assert len(set(positions)) == 24
    assert sync_db["ev.seq"].find_one({"_id": LAYOUT_ID})["partitions"] == 4
    doc = sync_db["ev"].find_one({"pt": 2})
    assert doc["v"] == 2 and doc["s"] == 1 and doc["n"] == 3  # version 2: its partition and sequence
    for group in ("a", "b"):
        readers = [stream.reader(group, start="beginning") for _ in range(3)]
        got = await read_together(readers, 24)
        assert sorted(m.payload for m in got) == list(range(24)), group  # each message once per group
        by_partition: dict[int, list[Position]] = defaultdict(list)
        for reader in readers:
            mine = [m for m in got if m._reader is reader]
            for m in mine:
                by_partition[m.position.partition].append(m.position)
            for pt in range(4):  # a reader gets each partition's messages in order
                seen = [m.position for m in mine if m.position.partition == pt]
                assert seen == sorted(seen)
        assert {pt: sorted(p) for pt, p in by_partition.items()} == {
            pt: [p for p in positions if p.partition == pt] for pt in range(4)}
    stats = await stream.stats()
    assert stats["last_sequence"] == [2, 2, 2, 2] and stats["groups"]["a"]["lag_messages"] == 0
    assert stats["groups"]["a"]["position"] == "3:0 1/3:0 2/3:0 3/3:0"


async def test_a_version_1_stream_keeps_its_format_and_refuses_to_be_partitioned(make_stream, sync_db):
    old = make_stream(partitions=None)
    assert await old.push("a") == Position(1, 0)
    assert sync_db["ev"].find_one({"_id": 1})["v"] == 1 and sync_db["ev.seq"].find_one({"_id": LAYOUT_ID}) is None
    with pytest.raises(bucketq.InvalidOption, match="version-1 stream"):
        await make_stream().push("b")
    one = make_stream(partitions=1).reader("g", start="beginning")
    assert [m.payload for m in await read_all(one, want=1)] == ["a"]
    with pytest.raises(bucketq.InvalidOption, match="partitioned in 4"):
        await make_stream(name="other", partitions=4).push("x") and await make_stream(name="other",
                                                                                         partitions=2).push("y")
    unsaid = make_stream(name="other", partitions=None)  # takes the stream's own count
    assert len((await unsaid.stats())["last_sequence"]) == 4
    with pytest.raises(bucketq.InvalidOption, match="partitions"):
        make_stream(partitions=0)


async def test_a_reader_killed_holding_a_bucket_of_one_partition_delays_only_that_partition(make_stream):
    stream = make_stream(lease=3)  # the other partitions are read well within it, even on a loaded machine
    positions = await push_writes(stream, 4, per_write=2)  # one bucket in each partition
    dying = stream.reader("g", start="beginning")
    held = await dying.read_many(2, timeout=1)
    assert [m.position for m in held] == [p for p in positions if p.partition == held[0].position.partition]
    await held[0].ack()
    await dying.flush()
    dying._flusher.cancel()  # killed: its lease on that bucket runs out, unextended
    other = stream.reader("g")
    others = sorted(set(positions) - {m.position for m in held})
    first = await read_all(other, want=len(others))  # the other partitions, before the lease ends
    assert sorted(m.position for m in first) == others
    again = await read_all(other, want=1)  # then the dead reader's unwritten ack, after its lease
    assert [m.position for m in again] == [held[1].position]


async def test_the_hole_rule_holds_per_partition(make_stream, sync_db):
    # more than the reads before the check of the stall take on a loaded machine (2 s was not, beside two busy loops)
    stream = make_stream(gap_wait=5.0)
    positions = await push_writes(stream, 4, per_write=1)
    hole = positions[0].partition
    sync_db["ev.seq"].update_one({"_id": f"seq.{hole}"}, {"$inc": {"last": 1}})  # a producer killed: seq 2
    positions += await push_writes(stream, 4, per_write=1)  # sequence 3 there, 2 elsewhere
    assert Position(3, 0, hole) in positions
    reader = stream.reader("g", start="beginning")
    early = await read_all(reader, want=8)
    assert len(early) == 8  # readers read past a hole; only the commit waits
    group = await stream.store.group("g")
    assert group is not None and group.positions[hole] == Position(2, 0, hole)  # stalled at the hole
    assert all(p.seq == 3 for p in group.positions if p.partition != hole)  # the others went on

    async def gap_marked_and_passed() -> bool:  # once the hole has waited gap_wait, a read marks it a gap
        await read_all(reader, timeout=0.2)
        marker = sync_db["ev"].find_one({"pt": hole, "s": 2})
        group = await stream.store.group("g")
        return marker is not None and marker.get("gap") is True \
            and group is not None and group.positions[hole] == Position(4, 0, hole)

    await eventually(gap_marked_and_passed, what="the hole marked a gap and the group past it")


async def test_retention_applies_to_each_partition(make_stream, sync_db):
    stream = make_stream(retention_messages=2)
    await no_background_housekeeping(stream)
    slow = stream.reader("slow", start="beginning")
    await slow.read(timeout=0)  # joins at the beginning
    await push_writes(stream, 12, per_write=1)  # three buckets of one message in each partition
    result = await stream.apply_retention()
    assert result == {"floor": [2, 2, 2, 2], "deleted": 4}
    assert sorted(d["s"] for d in sync_db["ev"].find({})) == [2, 2, 2, 2, 3, 3, 3, 3]
    stats = await stream.stats()
    assert stats["floor"] == [2, 2, 2, 2] and stats["groups"]["slow"]["expired"] == 4
    assert sorted(m.payload for m in await read_all(slow, want=8)) == list(range(4, 12))


async def test_a_reset_moves_every_partition_or_only_those_named(make_stream):
    stream = make_stream()
    positions = await push_writes(stream, 4, per_write=2)
    reader = stream.reader("g", start="beginning")
    assert len(await read_all(reader, want=8)) == 8
    at = await stream.reset("g", "beginning")
    assert at == [Position(1, 0, pt) for pt in range(4)]
    assert len(await read_all(reader, want=8)) == 8
    one = positions[-1]  # a reset to one position moves only its partition
    at = await stream.reset("g", one)
    assert at[one.partition] == one and all(p.seq == 2 for p in at if p.partition != one.partition)
    assert [m.position for m in await read_all(reader, want=1)] == [one]
    with pytest.raises(bucketq.InvalidOption, match="partition 7"):
        await stream.reset("g", Position(1, 0, 7))


async def test_a_reader_started_before_the_stream_exists_learns_its_partitions(make_stream):
    early = make_stream(partitions=None)
    reader = early.reader("g", start="beginning")
    assert await reader.read(timeout=0.05) is None  # no stream yet: the group is one position, 1:0
    await early.reset("other", "end")  # so is this one
    stream = make_stream()
    positions = await push_writes(stream, 4, per_write=1)
    assert (await stream.stats())["groups"]["other"]["position"] == "1:0 1/1:0 2/1:0 3/1:0"
    got = await read_all(reader, want=4)  # it looks again each RECHECK_S; its group spreads over them
    assert sorted(m.position for m in got) == sorted(positions) and len(early.store.parts) == 4
    assert (await stream.store.group("g")).positions == tuple(Position(2, 0, pt) for pt in range(4))

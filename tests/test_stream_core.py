"""Properties of the stream core (the stream modules of bucketq/core): positions, the commit rule, a held bucket's state
machine, retention cuts and hole watching."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketq import InvalidOption
from bucketq.core.reader_groups import advance
from bucketq.core.stream_format import Partition, Position
from bucketq.core.stream_gaps import HoleWatch
from bucketq.core.stream_held import HeldStreamBucket
from bucketq.core.stream_retention import RetentionCut

positions = st.builds(Position, st.integers(0, 2**62), st.integers(0, 65535), st.integers(0, 1023))


@given(positions, positions)
def test_positions_order_like_the_stream_and_survive_their_text_form(a: Position, b: Position) -> None:
    assert Position.parse(str(a)) == a and Position.parse((a.seq, a.slot, a.partition)) == a
    assert Position.parse((a.seq, a.slot)) == a._replace(partition=0) == Position(a.seq, a.slot)
    assert ("/" in str(a)) == (a.partition > 0)  # a stream of one partition keeps its text form
    b = b._replace(partition=a.partition)
    assert (a < b) == ((a.seq, a.slot) < (b.seq, b.slot))  # ordered within a partition


@pytest.mark.parametrize("bad", ["", "x:1", "1:x", "-1:0", "1:65536", (1,), (True, 0), 1.5, "1024/1:0", "x/1:0",
                                 (1, 0, -1), (1, 2, 3, 4)])
def test_bad_positions_are_refused(bad: object) -> None:
    with pytest.raises(InvalidOption):
        Position.parse(bad)  # type: ignore[arg-type]


@given(st.integers(1, 50), st.sets(st.integers(1, 80)), st.sets(st.integers(1, 80)))
def test_a_commit_passes_only_present_settled_sequences_in_order(start: int, present: set[int],
                                                                  settled: set[int]) -> None:
    end = advance(start, present, settled)
    assert end >= start
    assert all(s in present and s in settled for s in range(start, end))
    assert not (end in present and end in settled)  # it stops at the first missing or unsettled one


@given(st.integers(1, 40), st.sets(st.integers(0, 39)), st.lists(st.integers(1, 7), max_size=20),
       st.permutations(list(range(40))))
def test_a_held_bucket_delivers_each_slot_once_in_order_and_completes_when_all_are_acked(
        size: int, done: set[int], takes: list[int], ack_order: list[int]) -> None:
    done = {d for d in done if d < size}
    claim = {"_id": {"g": "g", "e": 0, "s": 1}, "done": sorted(done)}
    doc = {"_id": 1, "v": 1, "enc": "json", "created": dt.datetime(2026, 1, 1), "n": size, "p": ["x"] * size}
    held = HeldStreamBucket.parse(doc, Partition(), claim, 0, "token")
    delivered: list[int] = []
    for n in [*takes, size]:
        delivered += held.take(n)
    assert delivered == sorted(set(range(size)) - done)
    for slot in [s for s in ack_order if s in delivered]:
        assert not held.complete
        held.acked.add(slot)
    assert held.complete
    held.written(held.unwritten())
    assert held.unwritten() == [] and held.done == set(range(size))


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 50), st.integers(0, 5000)), min_size=1, max_size=30),
       st.one_of(st.none(), st.integers(1, 300)), st.one_of(st.none(), st.integers(1, 20000)),
       st.one_of(st.none(), st.integers(0, 120)))
def test_retention_keeps_the_longest_newest_run_within_every_limit(buckets: list[tuple[int, int, int]],
                                                                    max_messages: int | None,
                                                                    max_bytes: int | None,
                                                                    max_age: int | None) -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [(seq, now - dt.timedelta(seconds=age), n, size)
            for seq, (age, n, size) in enumerate(sorted(buckets, reverse=True), start=1)]  # older first
    cut = RetentionCut(now, max_age, max_messages, max_bytes)
    for seq, created, n, size in reversed(rows):
        if not cut.take(seq, created, n, size):
            break
    floor = cut.floor or 1
    kept = [r for r in rows if r[0] >= floor]

    def within(part: list) -> bool:
        return ((max_messages is None or sum(r[2] for r in part) <= max_messages)
                and (max_bytes is None or sum(r[3] for r in part) <= max_bytes)
                and (max_age is None or all(r[1] >= now - dt.timedelta(seconds=max_age) for r in part)))

    assert within(kept)
    assert floor == 1 or not within(rows[floor - 2:])  # one more bucket would break a limit


def test_a_hole_is_due_only_after_gap_wait_since_first_seen_and_forgotten_once_filled() -> None:
    watch = HoleWatch(gap_wait=5.0)
    assert watch.due([3, 4], 100.0) == []
    assert watch.due([3, 4], 104.9) == []
    assert watch.due([4, 7], 105.0) == [4]  # 3 landed meanwhile; 7 is new
    assert watch.due([3], 106.0) == []  # 3 missing again: its clock starts over (and 7 is forgotten)
    assert watch.due([3, 7], 110.0) == []
    assert watch.due([3, 7], 111.0) == [3]
    assert watch.due([3, 7], 115.0) == [3, 7]

"""Property tests of the sans-I/O core: the accumulator and the codecs (the consume state machine: test_held.py)."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import itertools
import math

import bson
import pytest
from bson import ObjectId
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bucketq.codecs import BsonCodec, JsonCodec, MsgpackCodec
from bucketq.core.accumulator import Accumulator, SealedBucket
from bucketq.core.format import (
    BUCKET_OVERHEAD,
    Slot,
    bucket_document,
    encode_slot,
    parse_bucket,
    payload_size,
    slot_bytes,
)
from bucketq.errors import WriteFailed
from tests.helpers import examples

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

pushes = st.lists(st.tuples(st.integers(1, 3000),                     # payload length
                            st.one_of(st.none(), st.floats(0, 30)),   # delay
                            st.floats(0, 0.3),                        # seconds until the next push
                            st.sampled_from([0, 0, 0, 1, 9])),        # priority level
                  min_size=1, max_size=300)


@settings(max_examples=examples(100), deadline=None)
@given(pushes, st.integers(1, 50), st.integers(4096, 40_000), st.floats(0.01, 5))
def test_accumulator_places_every_message_once_within_limits(items, max_size, max_bytes, granularity):
    acc = Accumulator(max_size=max_size, max_bytes=max_bytes, max_wait=0.5, granularity=granularity, codec="json")
    sealed, dues, levels, clock = [], {}, {}, 0.0
    for n, (length, delay, gap, level) in enumerate(items):
        now = T0 + dt.timedelta(seconds=clock)
        payload = f"{n:06d}" + "x" * length
        due = now + dt.timedelta(seconds=delay) if delay else None
        dues[payload[:6]] = due
        levels[payload[:6]] = level
        full = acc.add(Slot(payload), slot_bytes(payload), None, due=due, now_wall=now, now_mono=clock,
                       priority=level)
        sealed += full
        clock += gap
        sealed += acc.ready(T0 + dt.timedelta(seconds=clock), clock)
    sealed += acc.seal_all(T0 + dt.timedelta(seconds=clock))
    seen = [p[:6] for b in sealed for p in b.document["p"]]
    assert sorted(seen) == sorted(dues), "a message was lost or placed twice"
    for bucket in sealed:
        doc = bucket.document
        assert 1 <= doc["n"] <= max_size
        assert bucket.size_bytes <= max_bytes or doc["n"] == 1
        assert {levels[p[:6]] for p in doc["p"]} == {doc.get("pr", 0)}, "a bucket holds one level, stored as pr"
        assert doc.get("pr") != 0, "level 0 is written as no pr"
        own = [dues[p[:6]] for p in doc["p"]]
        if bucket.immediate:
            assert all(d is None or d <= doc["due"] for d in own)
        else:
            assert all(d is not None for d in own), "an immediate message waited in a delayed bucket"
            assert all(0 <= (doc["due"] - d).total_seconds() <= granularity + 1e-3 for d in own)
        acc.written(bucket)
    assert acc.buffered_bytes == 0 and acc.in_flight == 0


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=200), st.integers(1, 50), st.integers(4096, 40_000))
def test_append_is_add_without_the_clock_for_messages_due_now(lengths, max_size, max_bytes):
    """The producer's fast path (``append``, falling back to ``add`` when it declines) makes the same buckets, with
    the same slots, sizes and waiters, as ``add`` alone; a declined ``append`` changes nothing."""
    def run(fast: bool) -> tuple[list[tuple[list, list, int]], int]:
        acc = Accumulator(max_size=max_size, max_bytes=max_bytes, max_wait=0.5, granularity=1.0, codec="json")
        sealed = []
        for n, length in enumerate(lengths):
            payload = f"{n:06d}" + "x" * length
            size = slot_bytes(payload)
            before = acc.buffered_bytes, [(b.slots[:], b.size_bytes) for b in acc._open.values()]
            if fast and acc.append(Slot(payload), size, n):
                continue
            assert before == (acc.buffered_bytes, [(b.slots[:], b.size_bytes) for b in acc._open.values()])
            sealed += acc.add(Slot(payload), size, n, due=None, now_wall=T0, now_mono=0.0)
        sealed += acc.seal_all(T0)
        return [(b.document["p"], b.waiters, b.size_bytes) for b in sealed], acc.buffered_bytes

    assert run(fast=True) == run(fast=False)


class _RunLog:
    """A run waiter that records what it was settled with."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def done(self) -> bool:
        return False

    def set_result(self, message_id: str) -> None:
        self.ids.append(message_id)

    def set_results(self, message_ids: list[str]) -> None:
        self.ids += message_ids

    def set_exception(self, failure: BaseException) -> None:
        raise AssertionError(failure)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=200), st.integers(1, 50), st.integers(4096, 40_000),
       st.integers(0, 60_000), st.integers(0, 8))
def test_extend_fills_buckets_as_appending_one_by_one_does(lengths, max_size, max_bytes, room, tight):
    """``extend`` (``push_many``'s run path) takes messages into the open bucket exactly as ``append`` one at a
    time would, stops at ``room`` bytes, and its run waiter is settled with the ids of its slots in order.
    ``tight``: a bucket of the first ``tight`` messages is exactly ``max_bytes``, the bound's edge."""
    slots = [Slot(f"{n:06d}" + "x" * length) for n, length in enumerate(lengths)]
    sizes = [slot_bytes(s.payload) for s in slots]
    if tight:
        max_bytes = BUCKET_OVERHEAD + sum(sizes[:tight])

    def run(bulk: bool) -> tuple[list[tuple[list, int]], int]:
        acc = Accumulator(max_size=max_size, max_bytes=max_bytes, max_wait=0.5, granularity=1.0, codec="json")
        sealed, log, index = [], _RunLog(), 0
        while index < len(slots):
            if bulk:
                taken = acc.extend(slots, sizes, index, len(slots), log, room + sizes[index] * (index % 3 == 0))
            else:  # append while it takes the next message and the room holds it
                taken, added = 0, 0
                while index + taken < len(slots) and added + sizes[index + taken] <= room + \
                        sizes[index] * (index % 3 == 0) and acc.append(slots[index + taken], sizes[index + taken], log):
                    added += sizes[index + taken]
                    taken += 1
            if not taken:
                sealed += acc.add(slots[index], sizes[index], log, due=None, now_wall=T0, now_mono=0.0)
                taken = 1
            index += taken
        sealed += acc.seal_all(T0)
        for bucket in sealed:
            bucket.resolve()
        order = {str(b.id): k for k, b in enumerate(sealed)}  # ids by the bucket's place, not its random _id
        ids = [f"{order[i.split(':')[0]]}:{i.split(':')[1]}" for i in log.ids]
        assert ids == [f"{k}:{slot}" for k, b in enumerate(sealed) for slot in range(len(b.document["p"]))]
        return [(b.document["p"], b.size_bytes) for b in sealed], acc.buffered_bytes

    assert run(bulk=True) == run(bulk=False)


class GroupCommitMachine(RuleBasedStateMachine):
    """A shell that obeys the accumulator (asks ``ready`` after each burst of pushes, when a write ends and
    at ``next_deadline``), with writes ending in any order: an open bucket is written at once when no write is
    in flight (after ``min_wait``, 0 by default), waits while writes are in flight unless it is full, and
    never waits past ``max_wait``."""

    MIN_WAIT = 0.0
    MAX_WAIT = 0.5
    MAX_SIZE = 5
    MAX_BYTES = 6000

    def __init__(self) -> None:
        super().__init__()
        self.acc = Accumulator(max_size=self.MAX_SIZE, max_bytes=self.MAX_BYTES, max_wait=self.MAX_WAIT,
                               granularity=1.0, codec="json", min_wait=self.MIN_WAIT)
        self.clock = 0.0
        self.added_at: dict[str, float] = {}
        self.placed: list[str] = []
        self.writes: list[SealedBucket] = []  # sealed and not yet written: the writes in flight

    def wall(self) -> dt.datetime:
        return T0 + dt.timedelta(seconds=self.clock)

    def waited(self, bucket: SealedBucket) -> float:
        return self.clock - min(self.added_at[p[:6]] for p in bucket.document["p"])

    def sealed(self, buckets: list[SealedBucket]) -> None:
        for bucket in buckets:
            assert self.waited(bucket) <= self.MAX_WAIT + 1e-9, "a message waited past max_wait"
            self.placed += [p[:6] for p in bucket.document["p"]]
        self.writes += buckets

    def commit(self) -> None:
        idle = not self.writes
        ready = self.acc.ready(self.wall(), self.clock)
        floor = self.MIN_WAIT if idle else self.MAX_WAIT
        assert all(self.waited(b) >= floor - 1e-9 for b in ready), \
            "a bucket was written before min_wait, or before max_wait while another write was in flight"
        self.sealed(ready)
        deadline = self.acc.next_deadline()
        if idle and not self.MIN_WAIT:
            assert deadline is None, "a bucket stayed open with no write in flight"
        else:
            assert deadline is None or deadline > self.clock, "a bucket past max_wait stayed open"

    def advance(self, seconds: float) -> None:
        """Let time pass; the shell's timer fires at each deadline on the way."""
        target = self.clock + seconds
        while (deadline := self.acc.next_deadline()) is not None and deadline <= target:
            self.clock = max(self.clock, deadline)
            self.commit()
        self.clock = target

    @rule(length=st.integers(1, 2500), delay=st.one_of(st.none(), st.floats(0.001, 5)), gap=st.floats(0, 0.3),
          burst=st.integers(1, 7))
    def push(self, length: int, delay: float | None, gap: float, burst: int) -> None:
        """A burst of pushes within one turn of the event loop, then the shell's commit."""
        self.advance(gap)
        for _ in range(burst):
            name = f"{len(self.added_at):06d}"
            payload = name + "x" * length
            self.added_at[name] = self.clock
            due = self.wall() + dt.timedelta(seconds=delay) if delay else None
            size = slot_bytes(payload)
            full = self.acc.add(Slot(payload), size, None, due=due, now_wall=self.wall(), now_mono=self.clock)
            assert all(b.document["n"] == self.MAX_SIZE or b.size_bytes + size > self.MAX_BYTES
                       or b.size_bytes >= self.MAX_BYTES for b in full), "add sealed a bucket that was not full"
            self.sealed(full)
        self.commit()

    @precondition(lambda self: self.writes)
    @rule(data=st.data(), took=st.floats(0, 1))
    def write_ends(self, data: st.DataObject, took: float) -> None:
        self.advance(took)
        bucket = self.writes.pop(data.draw(st.integers(0, len(self.writes) - 1)))
        self.acc.written(bucket)
        self.commit()

    @invariant()
    def in_flight_counts_the_unwritten_buckets(self) -> None:
        assert self.acc.in_flight == len(self.writes)

    def teardown(self) -> None:
        self.sealed(self.acc.seal_all(self.wall()))
        for bucket in self.writes:
            self.acc.written(bucket)
        assert sorted(self.placed) == sorted(self.added_at), "a message was lost or placed twice"
        assert self.acc.buffered_bytes == 0 and self.acc.in_flight == 0


TestGroupCommit = GroupCommitMachine.TestCase
TestGroupCommit.settings = settings(max_examples=examples(80), stateful_step_count=40, deadline=None)


class LingeringGroupCommitMachine(GroupCommitMachine):
    """The same with ``bucket_min_wait``: a bucket waits that long for company even when no write is in flight."""

    MIN_WAIT = 0.05


TestLingeringGroupCommit = LingeringGroupCommitMachine.TestCase
TestLingeringGroupCommit.settings = settings(max_examples=examples(60), stateful_step_count=40, deadline=None)


@given(st.integers(1, 30), st.sets(st.integers(0, 29)), st.booleans())
def test_sealed_bucket_resolves_each_waiter_once_with_a_failure_of_its_own(n, cancelled, fails):
    doc = bucket_document(ObjectId(), [Slot(f'"{i}"') for i in range(n)], codec="json", created=T0, due=T0)
    waiters = [concurrent.futures.Future() for _ in range(n)]
    for i in cancelled & set(range(n)):
        waiters[i].cancel()
    error = ConnectionError("refused") if fails else None
    bucket = SealedBucket(doc, list(waiters), 0, immediate=True)
    bucket.resolve(error)
    bucket.resolve(ConnectionError("a second outcome changes nothing"))
    live = [(i, w) for i, w in enumerate(waiters) if i not in cancelled]
    if fails:
        failures = [w.exception() for _, w in live]
        assert all(isinstance(f, WriteFailed) and f.__cause__ is error for f in failures)
        assert len({id(f) for f in failures}) == len(failures), "waiters share one failure object"
    else:
        assert [w.result() for _, w in live] == [f"{doc['_id']}:{i}" for i, _ in live]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


@given(json_values)
def test_json_codec_round_trips_json_values(value):
    codec = JsonCodec()
    stored = codec.dump(value)
    assert isinstance(stored, str)
    assert codec.load(stored) == value


@given(json_values.filter(lambda v: not isinstance(v, int) or -2**63 <= v < 2**64))
def test_msgpack_codec_round_trips(value):
    codec = MsgpackCodec()
    stored = codec.dump(value)
    assert isinstance(stored, bytes)
    assert codec.load(stored) == value


# What BSON keeps as it is: besides JSON's values, 64-bit ints, binary, ObjectIds and UTC dates to the millisecond.
bson_dates = st.datetimes(timezones=st.just(dt.timezone.utc)).map(lambda d: d.replace(microsecond=d.microsecond // 1000
                                                                                      * 1000))
bson_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text()
    | st.binary() | st.builds(ObjectId) | bson_dates,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text().filter(lambda k: "\0" not in k), children, max_size=5),
    max_leaves=10,
)
bson_documents = st.dictionaries(st.text(max_size=10).filter(lambda k: "\0" not in k), bson_values, max_size=6)


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(bson_documents, min_size=1, max_size=4))
def test_bson_codec_round_trips_documents_through_a_stored_bucket(payloads):
    """Pushed, written, read back by a consumer (the store's codec options), parsed and loaded: the same documents,
    each bucket no larger than its slots' counted bytes say."""
    from bucketq.codecs import _AS_READ

    codec = BsonCodec()
    slots, sizes = zip(*(encode_slot(codec, p, None, None) for p in payloads), strict=True)
    doc = bucket_document(ObjectId(), slots, codec="bson", created=T0, due=T0)
    raw = bson.encode(doc)
    assert len(raw) <= BUCKET_OVERHEAD + sum(sizes)
    assert [payload_size(slot.payload) for slot in slots] == [len(bson.encode(p)) for p in payloads]
    parsed = parse_bucket(bson.decode(raw, codec_options=_AS_READ))
    loaded = [codec.load(p) for p in parsed.payloads]
    assert loaded == payloads
    loaded[0]["changed"] = True  # a consumer's copy: the stored payload (what a retry copies) stays as pushed
    assert "changed" not in parsed.payloads[0]


@given(st.one_of(st.lists(st.integers()), st.text(), st.integers(), st.none()))
def test_bson_codec_refuses_what_is_no_document(payload):
    with pytest.raises(TypeError, match="stores documents"):
        BsonCodec().dump(payload)


@given(st.sampled_from([math.nan, math.inf, -math.inf]), st.sampled_from(["top", "list", "dict", "flat"]))
def test_json_codec_refuses_non_finite_floats(bad, where):
    value = {"top": bad, "list": [1, [bad]], "dict": {"a": {"b": bad}}, "flat": {"a": 1, "b": bad}}[where]
    with pytest.raises(ValueError, match="not valid JSON"):
        JsonCodec().dump(value)


@given(st.lists(st.tuples(st.text(max_size=20), st.one_of(st.none(), st.text(max_size=5))), min_size=1,
                max_size=20))
def test_bucket_documents_parse_back(items):
    slots = [Slot(JsonCodec().dump(p), key=k) for p, k in items]
    doc = bucket_document(__import__("bson").ObjectId(), slots, codec="json", created=T0, due=T0)
    parsed = parse_bucket(doc)
    assert parsed.size == len(items) and parsed.keys == [k for _, k in items]
    assert slot_bytes(slots[0].payload) + BUCKET_OVERHEAD > 0


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.booleans(), st.integers(0, 9)), min_size=1, max_size=60),
       st.integers(1, 30), st.integers(4_000, 40_000))
@example([(1000, False, 0)] * 10, 30, 4_000)  # bytes bind, not the count: a bound off by one slot fails it
def test_copies_are_split_into_buckets_within_max_bytes_in_order(items, max_size, max_bytes):
    """Copies (retries, requeues) with tries, origins and headers are split so that each bucket stays within
    ``max_size`` slots and ``max_bytes`` BSON bytes (a slot alone may be larger), in order, none lost, and
    no bucket ends before it had to."""
    from bucketq.core.format import bucket_documents, copy_bytes

    slots = [Slot("x" * n, headers={"h": "y" * 40} if with_headers else None, tries=tries,
                  origin=f"{ObjectId()}:{n}", enqueued_at=T0) for n, with_headers, tries in items]
    docs = bucket_documents(slots, codec="json", created=T0, due=T0, max_size=max_size, max_bytes=max_bytes)
    assert [p for d in docs for p in d["p"]] == [s.payload for s in slots]
    for doc in docs:
        assert len(doc["p"]) <= max_size
        assert len(doc["p"]) == 1 or len(bson.encode(doc)) <= max_bytes
    used = [0, *itertools.accumulate(len(d["p"]) for d in docs)]
    for start, end in itertools.pairwise(used):
        if end < len(slots):  # the next slot did not fit: by count, or by the bound of its bytes
            full = sum(copy_bytes(s) for s in slots[start:end + 1]) + BUCKET_OVERHEAD
            assert end - start >= max_size or full > max_bytes


@given(st.integers(0, 100_000), st.floats(1.0, 10.0))
def test_backoff_stays_within_its_cap_for_any_attempt(attempt, factor):
    from bucketq.core.backoff import Backoff

    backoff = Backoff(base=1.0, factor=factor, maximum=300.0)
    assert 0 < backoff.delay(attempt) <= 300.0  # no OverflowError once factor**attempt leaves the floats


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.sampled_from([None, "a", "b", "é" * 500]), st.booleans()),
                min_size=1, max_size=200),
       st.integers(1, 20), st.integers(4096, 40_000))
def test_accumulator_writes_a_groups_buckets_one_at_a_time_in_push_order(items, max_size, max_bytes):
    """Grouped pushes (``push(group=...)``) among ungrouped ones, with writes ending at random: a bucket holds
    one group only; at most one bucket of a group is handed out to write until that write ends; a group's
    messages are handed out in push order; every bucket's stored size (``t``, ``g``, ``s`` included) stays
    within its counted bytes; every buffered byte is given back."""
    acc = Accumulator(max_size=max_size, max_bytes=max_bytes, max_wait=0.5, granularity=1.0, codec="json")
    handed: list = []  # handed out to write, in order
    writing: list = []
    pushed: dict[str | None, list[str]] = {}

    def hand_out(buckets: list) -> None:
        for bucket in buckets:
            group = bucket.document.get("g")
            assert all(w.document.get("g") != group for w in writing if group is not None), \
                "two buckets of a group written at once"
            handed.append(bucket)
            writing.append(bucket)

    for n, (length, group, write_ends) in enumerate(items):
        payload = f"{n:06d}" + "x" * length
        pushed.setdefault(group, []).append(payload[:6])
        hand_out(acc.add(Slot(payload), slot_bytes(payload), None, due=None, now_wall=T0, now_mono=float(n),
                         group=group))
        if write_ends and writing:
            hand_out(acc.written(writing.pop(0)))
        hand_out(acc.ready(T0, float(n)))
    hand_out(acc.seal_all(T0))
    while writing:
        hand_out(acc.written(writing.pop(0)))
    for group, ids in pushed.items():
        got = [p[:6] for b in handed if b.document.get("g") == group for p in b.document["p"]]
        assert got == ids if group is not None else sorted(got) == sorted(ids)
    for bucket in handed:
        doc = bucket.document
        assert bucket.group == doc.get("g") and (doc["v"] == 2) == ("g" in doc)
        assert len(bson.encode({**doc, "s": 2**62})) <= bucket.size_bytes
    assert acc.buffered_bytes == 0 and acc.in_flight == 0


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(1e9, 4e9), st.floats(0.0, 10.0), st.floats(0.0, 1e6),
       st.lists(st.one_of(st.floats(0.0, 0.002), st.floats(0.0, 100.0)), min_size=1, max_size=60),
       st.one_of(st.none(), st.tuples(st.integers(0, 59), st.floats(-5.0, 5.0), st.floats(0.0, 10.0))))
def test_clock_latest_kept_between_readings_is_the_reading_it_would_compute(server_s, error_s, anchor_s, steps,
                                                                          resync):
    """``latest()`` keeps its last datetime until the exact reading passes it: each reading must be what it would
    compute afresh (the rounded-up millisecond of the exact reading), through readings a microsecond apart and
    across a new anchor, and so never earlier than the exact reading."""
    from unittest import mock

    from bucketq.shell import clock as clock_module

    mono = anchor_s
    with mock.patch.object(clock_module.time, "monotonic", lambda: mono):
        clock = clock_module.ServerClock()
        clock._anchor(server_s, anchor_s, error_s)
        for n, step in enumerate(steps):
            if resync is not None and resync[0] == n:  # a sync moves the anchor, either way
                server_s, error_s = clock._server_s + resync[1], resync[2]
                clock._anchor(server_s, mono, error_s)
                anchor_s = mono
            mono += step
            since = mono - anchor_s
            afresh = math.ceil((server_s + error_s + since + clock_module.MAX_DRIFT * since) * 1000)
            got = clock.latest()
            assert got == dt.datetime.fromtimestamp(afresh / 1000, dt.timezone.utc)
            assert got.timestamp() >= server_s + error_s + since * (1 + clock_module.MAX_DRIFT) - 1e-6

"""Property tests of the sans-I/O core: the accumulator, the held-bucket state machine and the codecs."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bucketq.codecs import JsonCodec, MsgpackCodec
from bucketq.core.accumulator import Accumulator
from bucketq.core.format import BUCKET_OVERHEAD, Slot, bucket_document, parse_bucket, slot_bytes
from bucketq.core.held import HeldBucket, SlotState
from bucketq.errors import AlreadyResolved

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

pushes = st.lists(st.tuples(st.integers(1, 3000),                     # payload length
                            st.one_of(st.none(), st.floats(0, 30)),   # delay
                            st.floats(0, 0.3)),                       # seconds until the next push
                  min_size=1, max_size=300)


@settings(max_examples=100, deadline=None)
@given(pushes, st.integers(1, 50), st.integers(4096, 40_000), st.floats(0.01, 5))
def test_accumulator_places_every_message_once_within_limits(items, max_size, max_bytes, granularity):
    acc = Accumulator(max_size=max_size, max_bytes=max_bytes, max_wait=0.5, granularity=granularity, codec="json")
    sealed, dues, clock = [], {}, 0.0
    for n, (length, delay, gap) in enumerate(items):
        now = T0 + dt.timedelta(seconds=clock)
        payload = f"{n:06d}" + "x" * length
        due = now + dt.timedelta(seconds=delay) if delay else None
        dues[payload[:6]] = due
        full = acc.add(Slot(payload), slot_bytes(payload), None, due=due, now_wall=now, now_mono=clock)
        sealed += full
        clock += gap
        sealed += acc.expired(T0 + dt.timedelta(seconds=clock), clock)
    sealed += acc.seal_all(T0 + dt.timedelta(seconds=clock))
    seen = [p[:6] for b in sealed for p in b.document["p"]]
    assert sorted(seen) == sorted(dues), "a message was lost or placed twice"
    for bucket in sealed:
        doc = bucket.document
        assert 1 <= doc["n"] <= max_size
        assert bucket.size_bytes <= max_bytes or doc["n"] == 1
        own = [dues[p[:6]] for p in doc["p"]]
        if bucket.immediate:
            assert all(d is None or d <= doc["due"] for d in own)
        else:
            assert all(d is not None for d in own), "an immediate message waited in a delayed bucket"
            assert all(0 <= (doc["due"] - d).total_seconds() <= granularity + 1e-3 for d in own)
        acc.written(bucket)
    assert acc.buffered_bytes == 0


def _bucket(n: int, claims: int = 1, tries: list[int] | None = None) -> HeldBucket:
    slots = [Slot(f'"{i}"', tries=(tries or [0] * n)[i]) for i in range(n)]
    doc = bucket_document(__import__("bson").ObjectId(), slots, codec="json", created=T0, due=T0)
    doc["c"] = claims
    return HeldBucket(parse_bucket(doc), "token", T0 + dt.timedelta(seconds=30), max_attempts=3)


class HeldBucketMachine(RuleBasedStateMachine):
    """Serve, ack, nack and flush in any order: every slot ends in exactly one final state, plans carry each
    resolution once, and the bucket is deleted exactly when every slot is resolved."""

    def __init__(self) -> None:
        super().__init__()
        self.next_bucket()

    @precondition(lambda self: self.deleted)
    @rule()
    def next_bucket(self) -> None:
        self.held = _bucket(8)
        self.served: list[int] = []
        self.planned: dict[int, SlotState] = {}
        self.deleted = False
        self.now = T0
        self.retry_at: dict[int, dt.datetime] = {}

    @precondition(lambda self: not self.deleted)
    @rule()
    def serve(self) -> None:
        slot = self.held.next_pending()
        if slot is not None:
            assert slot not in self.served
            self.served.append(slot)

    @precondition(lambda self: not self.deleted)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        if self.served:
            slot = data.draw(st.sampled_from(self.served))
            if self.held.state[slot] is SlotState.SERVED:
                self.held.ack(slot)
            else:
                with pytest.raises(AlreadyResolved):
                    self.held.ack(slot)

    @precondition(lambda self: not self.deleted)
    @rule(data=st.data(), delay=st.floats(0, 100))
    def nack(self, data: st.DataObject, delay: float) -> None:
        candidates = [s for s in self.served if self.held.state[s] is SlotState.SERVED]
        if candidates:
            slot = data.draw(st.sampled_from(candidates))
            retry_at = self.now + dt.timedelta(seconds=delay)
            outcome = self.held.nack(slot, retry_at, "err")
            assert outcome in (SlotState.RETRY, SlotState.DEAD)
            self.retry_at[slot] = retry_at

    @precondition(lambda self: not self.deleted)
    @rule(seconds=st.floats(0, 5))
    def flush(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        plan = self.held.plan(self.now, 30, granularity=1.0)
        assert not set(plan.slots) & set(self.planned), "a resolution was planned twice"
        self.planned.update(plan.slots)
        retried = sum(d["n"] for d in plan.retry_docs)
        assert retried == sum(1 for s in plan.slots.values() if s is SlotState.RETRY)
        assert len(plan.dead_docs) == sum(1 for s in plan.slots.values() if s is SlotState.DEAD)
        for doc in plan.retry_docs:
            assert all(t == 1 for t in doc["t"])
            own = [self.retry_at[int(origin.split(":")[1])] for origin in doc["o"]]
            assert max(own) == doc["due"], "a retry bucket is due later than the latest of its own messages"
            assert all((doc["due"] - d).total_seconds() <= 1.0 for d in own), "held back beyond the granularity"
        if plan.retry_docs or plan.dead_docs:
            assert plan.guard is not None, "copies must be preceded by a fenced lease check"
        self.deleted = plan.final[0] == "delete"
        assert self.deleted == self.held.finished

    @invariant()
    def finished_means_every_slot_resolved(self) -> None:
        resolved = sum(1 for s in self.held.state if s not in (SlotState.PENDING, SlotState.SERVED))
        assert self.held.finished == (resolved == 8)


TestHeldBucketMachine = HeldBucketMachine.TestCase
TestHeldBucketMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@given(st.integers(0, 5), st.integers(1, 5))
def test_tries_count_lease_expiries_and_base_tries(base, claims):
    held = _bucket(2, claims=claims, tries=[base, 0])
    assert held.tries(0) == base + claims - 1
    assert held.tries(1) == claims - 1


def test_nack_on_the_last_attempt_dead_letters():
    held = _bucket(1, claims=3)  # third delivery of a bucket whose leases expired twice; max_attempts=3
    held.next_pending()
    assert held.nack(0, T0, "boom") is SlotState.DEAD
    plan = held.plan(T0, 30, granularity=1.0)
    assert plan.dead_docs[0]["tries"] == 3 and plan.dead_docs[0]["error"] == "boom"
    assert plan.final == ("delete", None)


def test_release_plan_gives_back_the_claim():
    held = _bucket(3)
    held.next_pending()
    held.ack(0)
    plan = held.plan(T0, 30, granularity=1.0, release=True)
    kind, update = plan.final
    assert kind == "update" and update["$inc"] == {"c": -1} and update["$set"]["lease"] is None
    assert update["$addToSet"] == {"done": {"$each": [0]}}


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


@given(st.sampled_from([math.nan, math.inf, -math.inf]), st.sampled_from(["top", "list", "dict"]))
def test_json_codec_refuses_non_finite_floats(bad, where):
    value = {"top": bad, "list": [1, [bad]], "dict": {"a": {"b": bad}}}[where]
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

"""Property tests of the consume state machine (``bucketq.core.held``): serving, resolutions, flush plans and
the outcome of their writes (applied, refused, or unknown after an error), leases running out."""

from __future__ import annotations

import datetime as dt

import bson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bucketq.core import claims
from bucketq.core.format import BSON_LIMIT, MAX_BUCKET_BYTES, Slot, bucket_document, parse_bucket
from bucketq.core.held import ClaimedBucket, FlushPlan, Policy, SlotState
from bucketq.errors import AlreadyResolved, LeaseLost
from tests.helpers import examples

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
POLICY = Policy(lease=30.0, max_attempts=3, granularity=1.0)
N = 8


def _bucket(n: int, claims_: int = 1, tries: list[int] | None = None, policy: Policy = POLICY) -> ClaimedBucket:
    slots = [Slot(f'"{i}"', tries=(tries or [0] * n)[i]) for i in range(n)]
    doc = bucket_document(bson.ObjectId(), slots, codec="json", created=T0, due=T0)
    doc["c"] = claims_
    return ClaimedBucket(parse_bucket(doc), "token", policy.lease_from(T0), policy)


class HeldBucketMachine(RuleBasedStateMachine):
    """Serve, ack, nack, flush and let time pass in any order, with every write applied, refused or failing:
    each resolution is carried by exactly one plan, a plan whose writes failed comes back unchanged, the
    bucket is finished exactly when every slot is resolved, and once the lease is lost or the bucket ended
    nothing more is served and every resolution raises ``LeaseLost``."""

    def __init__(self) -> None:
        super().__init__()
        self.next_bucket()

    @precondition(lambda self: self.held.ended)
    @rule()
    def next_bucket(self) -> None:
        self.held = _bucket(N)
        self.served: list[int] = []
        self.planned: dict[int, SlotState] = {}
        self.now = T0
        self.retry_at: dict[int, dt.datetime] = {}
        self.failed: FlushPlan | None = None
        self.applied_until = self.held.lease_until

    @rule(seconds=st.floats(0, 12))
    def time_passes(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)

    @rule()
    def serve(self) -> None:
        slot = self.held.serve(self.now)
        if slot is None:
            return
        assert not self.held.lease_ending(self.now), "served from a bucket whose lease is ending"
        assert self.now < self.applied_until - dt.timedelta(seconds=POLICY.lease * POLICY.safety)
        assert slot not in self.served
        self.served.append(slot)

    @rule(n=st.integers(1, N))
    def serve_many(self, n: int) -> None:
        slots = self.held.serve_many(self.now, n)
        assert len(slots) <= n and not set(slots) & set(self.served)
        if slots:
            assert not self.held.lease_ending(self.now), "served from a bucket whose lease is ending"
        assert all(self.held.state[slot] is SlotState.SERVED for slot in slots)
        self.served += slots

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        if not self.served:
            return
        slot = data.draw(st.sampled_from(self.served))
        if self.held.ended:
            with pytest.raises(LeaseLost):
                self.held.ack(slot)
        elif self.held.state[slot] is SlotState.SERVED:
            self.held.ack(slot)
        else:
            with pytest.raises(AlreadyResolved):
                self.held.ack(slot)

    @rule(data=st.data())
    def ack_each(self, data: st.DataObject) -> None:
        """As ``ack`` of each in turn: the first that raises stops it, the ones before it acked."""
        if not self.served:
            return
        slots = data.draw(st.lists(st.sampled_from(self.served), min_size=1, unique=True))
        if self.held.ended:
            with pytest.raises(LeaseLost):
                self.held.ack_each(slots)
            return
        ok = next((i for i, slot in enumerate(slots) if self.held.state[slot] is not SlotState.SERVED), len(slots))
        if ok == len(slots):
            flush_due = self.held.ack_each(slots)
            assert flush_due == (self.held.finished or self.held.held_back is not None)
        else:
            with pytest.raises(AlreadyResolved):
                self.held.ack_each(slots)
        assert all(self.held.state[slot] is SlotState.ACKED for slot in slots[:ok])

    @rule(data=st.data(), delay=st.floats(0, 100))
    def nack(self, data: st.DataObject, delay: float) -> None:
        candidates = [s for s in self.served if self.held.state[s] is SlotState.SERVED]
        if not candidates:
            return
        slot = data.draw(st.sampled_from(candidates))
        retry_at = self.now + dt.timedelta(seconds=delay)
        if self.held.ended:
            with pytest.raises(LeaseLost):
                self.held.nack(slot, retry_at, "err")
            return
        assert self.held.nack(slot, retry_at, "err") in (SlotState.RETRY, SlotState.DEAD)
        self.retry_at[slot] = retry_at

    @precondition(lambda self: not self.held.ended)
    @rule(result=st.sampled_from(["applied", "refused", "error"]))
    def flush(self, result: str) -> None:
        plan = self.held.take_plan(self.now)
        if self.failed is not None:
            assert plan is self.failed, "a plan whose writes failed must be retried as it was"
        else:
            self._check_new_plan(plan)
        if result == "error":
            self.failed = plan
            return
        self.failed = None
        self.held.outcome(plan, result == "applied")
        if result == "refused":
            assert self.held.lost and self.held.ended and not self.held.needs_flush(self.now)
        elif plan.kind == "finish":
            assert self.held.ended
        elif plan.lease_until is not None:
            self.applied_until = max(self.applied_until, plan.lease_until)
            assert self.held.lease_until == self.applied_until

    def _check_new_plan(self, plan: FlushPlan) -> None:
        assert not set(plan.slots) & set(self.planned), "a resolution was planned twice"
        self.planned.update(plan.slots)
        retried = sum(d["n"] for d in plan.retry_docs)
        assert retried == sum(1 for s in plan.slots.values() if s is SlotState.RETRY)
        assert len(plan.dead_docs) == sum(1 for s in plan.slots.values() if s is SlotState.DEAD)
        for doc in plan.retry_docs:
            own = [self.retry_at[int(origin.split(":")[1])] for origin in doc["o"]]
            assert max(own) == doc["due"], "a retry bucket is due later than the latest of its own messages"
            assert all((doc["due"] - d).total_seconds() <= 1.0 for d in own), "held back beyond the granularity"
        if plan.retry_docs or plan.dead_docs:
            assert plan.guard is not None and plan.guard["$set"]["lease.until"], "copies need a fenced check"
        assert (plan.kind == "finish") == self.held.finished
        if plan.kind == "finish":
            assert plan.mine == claims.finished_by(self.held.bucket.ref, "token")
            assert plan.final["fin"]["token"] == "token" and plan.final["due"] == claims.TOMBSTONE_DUE
        else:
            assert plan.mine is None, "an extension retried without a match means the lease was lost"

    @invariant()
    def finished_means_every_slot_resolved(self) -> None:
        resolved = sum(1 for s in self.held.state if s not in (SlotState.PENDING, SlotState.SERVED))
        assert self.held.finished == (resolved == N)

    @invariant()
    def nothing_is_served_once_ended(self) -> None:
        if self.held.ended:
            assert self.held.serve(self.now) is None


TestHeldBucketMachine = HeldBucketMachine.TestCase
TestHeldBucketMachine.settings = settings(max_examples=examples(80), stateful_step_count=50, deadline=None)


@given(st.integers(0, 5), st.integers(1, 5))
def test_tries_count_lease_expiries_and_base_tries(base, claims_):
    held = _bucket(2, claims_=claims_, tries=[base, 0])
    assert held.tries(0) == base + claims_ - 1
    assert held.tries(1) == claims_ - 1


def test_slots_out_of_tries_are_dead_lettered_unserved():
    held = _bucket(2, claims_=3, tries=[1, 0])  # slot 0: 3 tries already (max_attempts 3); slot 1: 2
    assert held.serve(T0) == 1
    assert held.state[0] is SlotState.DEAD
    plan = held.take_plan(T0)
    assert plan.dead_docs[0]["tries"] == 3 and "leases expired" in plan.dead_docs[0]["error"]


@pytest.mark.parametrize(("claims_", "tries"), [(1, [0] * 5), (3, [1, 0, 1, 0, 0])])
def test_serve_many_serves_what_as_many_serves_would(claims_, tries):
    """In one pass for a plain bucket; slot by slot where tries may be used up (slots 0 and 2 here)."""
    one_by_one, at_once = _bucket(5, claims_, tries), _bucket(5, claims_, tries)
    one_by_one.ack(3)
    at_once.ack(3)
    expected = [one_by_one.serve(T0) for _ in range(2)]
    assert at_once.serve_many(T0, 2) == expected
    assert at_once.serve_many(T0, 5) == [s for s in iter(lambda: one_by_one.serve(T0), None)]
    assert at_once.state == one_by_one.state and at_once.serve_many(T0, 5) == []


def test_nack_on_the_last_attempt_dead_letters():
    held = _bucket(1, claims_=3)  # third delivery of a bucket whose leases expired twice; max_attempts=3
    held.serve(T0)
    assert held.nack(0, T0, "boom") is SlotState.DEAD
    plan = held.take_plan(T0)
    assert plan.dead_docs[0]["tries"] == 3 and plan.dead_docs[0]["error"] == "boom"
    assert plan.kind == "finish"


def test_release_plan_gives_back_the_claim_and_records_the_token():
    held = _bucket(3)
    held.serve(T0)
    held.ack(0)
    plan = held.take_plan(T0, release=True)
    assert plan.kind == "release" and plan.final["$inc"] == {"c": -1}
    assert plan.final["$set"]["lease"] is None and plan.final["$set"]["released"] == "token"
    assert plan.final["$addToSet"] == {"done": {"$each": [0]}}
    assert plan.mine == claims.released_by(held.bucket.ref, "token")


@pytest.mark.parametrize("release", [False, True])
def test_a_nacks_retry_copies_are_recorded_by_the_guard_and_taken_out_by_the_final_write(release):
    """The guard (``claims.guard``, the fenced write the batch side runs too) lists the copies a purge must end
    if they land after it; the write marking their slots done takes them out again."""
    held = _bucket(3)
    held.serve(T0)
    held.nack(0, T0)
    plan = held.take_plan(T0, release=release)
    copies = [doc["_id"] for doc in plan.retry_docs]
    assert copies and plan.guard == claims.guard(T0, POLICY.lease, [], copies)
    assert plan.guard["$addToSet"] == {"r": {"$each": copies}}
    assert plan.final["$pull"] == {"r": {"$in": copies}} and plan.final["$addToSet"] == {"done": {"$each": [0]}}


def test_give_back_retries_outstanding_messages_and_later_resolutions_raise_lease_lost():
    held = _bucket(3)
    first, second = held.serve(T0), held.serve(T0)
    held.ack(first)
    held.give_back(T0, "draining")
    assert held.state[second] is SlotState.RETRY and held.resolved(second)
    with pytest.raises(LeaseLost):
        held.ack(second)


def test_lease_ending_stops_serving_before_the_lease_runs_out():
    held = _bucket(4)
    margin_before_expiry = POLICY.lease_from(T0) - dt.timedelta(seconds=POLICY.lease * POLICY.safety)
    assert held.serve(margin_before_expiry - dt.timedelta(milliseconds=1)) is not None
    assert held.serve(margin_before_expiry) is None


def test_an_extension_counts_only_once_applied():
    held = _bucket(2)
    later = T0 + dt.timedelta(seconds=20)
    plan = held.take_plan(later)
    assert held.lease_until == POLICY.lease_from(T0), "an extension in flight must not count yet"
    assert held.serve(POLICY.lease_from(T0)) is None, "nothing served past the lease applied so far"
    held.outcome(plan, applied=True)
    assert held.lease_until == POLICY.lease_from(later)
    assert held.serve(POLICY.lease_from(T0)) is not None, "the extension applied moves the bound serve checks"


@pytest.mark.slow  # builds 65,536 slots, 14 MB (a second of CPU); the split bound's fast test is in test_properties
def test_retry_buckets_of_a_full_bucket_are_split_below_the_bson_limit():
    """65,536 messages of ~220 bytes fill a bucket near ``MAX_BUCKET_BYTES``; nacked, their copies carry ids,
    tries and enqueue times as well, more than one bucket can hold."""
    payload = '"' + "x" * 210 + '"'
    n = 65536
    slots = [Slot(payload) for _ in range(n)]
    doc = bucket_document(bson.ObjectId(), slots, codec="json", created=T0, due=T0)
    assert len(bson.encode(doc)) <= MAX_BUCKET_BYTES
    doc["c"] = 1
    held = ClaimedBucket(parse_bucket(doc), "token", POLICY.lease_from(T0), POLICY)
    while (slot := held.serve(T0)) is not None:
        held.nack(slot, T0 + dt.timedelta(seconds=5), "later")
    plan = held.take_plan(T0)
    assert len(plan.retry_docs) >= 2
    assert sum(d["n"] for d in plan.retry_docs) == n
    assert all(len(bson.encode(d)) <= MAX_BUCKET_BYTES < BSON_LIMIT for d in plan.retry_docs)


# -- group buckets: serial serving, nack as a release ---------------------------------------------------------

def _group_bucket(n: int, tries: list[int], claims_: int = 1) -> ClaimedBucket:
    slots = [Slot(f'"{i}"', tries=tries[i]) for i in range(n)]
    doc = bucket_document(bson.ObjectId(), slots, codec="json", created=T0, due=T0, group="g")
    doc.update(c=claims_, s=1)
    return ClaimedBucket(parse_bucket(doc), "token", POLICY.lease_from(T0), POLICY)


@settings(max_examples=examples(200), deadline=None)
@given(tries=st.lists(st.integers(0, 3), min_size=1, max_size=6),
       steps=st.lists(st.sampled_from(["serve", "ack", "nack", "dead", "flush"]), max_size=40))
def test_a_group_bucket_serves_one_slot_at_a_time_in_order_and_a_nack_releases_it(tries, steps):
    """Whatever the order of serve, ack, nack, dead and applied flushes: at most one slot is served at a time,
    in slot order; a nack that is not the last attempt stops serving, and the next plan releases the bucket
    due at the retry time with that slot's try added, the claim uncounted and the slot not done; every plan
    that extends the lease leaves the group's lock lasting at least as long (extending it first if need be)."""
    held = _group_bucket(len(tries), tries)
    served: list[int] = []
    current: int | None = None
    retried: tuple[int, dt.datetime] | None = None
    now = T0
    for step in steps:
        if held.ended:
            break
        now += dt.timedelta(seconds=1)
        if step == "serve":
            slot = held.serve(now)
            if current is not None or retried is not None:
                assert slot is None, "a second slot of the group served before the first was resolved"
            if slot is not None:
                assert not served or slot > served[-1], "served out of slot order"
                served.append(slot)
                current = slot
        elif step in ("ack", "dead") and current is not None:
            held.ack(current) if step == "ack" else held.dead(current, "no")
            current = None
        elif step == "nack" and current is not None:
            retry_at = now + dt.timedelta(seconds=5)
            if held.nack(current, retry_at) is SlotState.RETRY:
                retried = (current, retry_at)
            current = None
        elif step == "flush":
            plan = held.take_plan(now)
            if retried is not None:
                slot, retry_at = retried
                assert plan.kind == "release" and not plan.retry_docs
                assert plan.final["$inc"] == {"c": -1, f"t.{slot}": 1}
                assert plan.final["$set"]["due"] == retry_at and "w" in plan.final["$unset"]
                assert slot not in plan.final.get("$addToSet", {}).get("done", {}).get("$each", [])
            if plan.kind == "extend" or plan.guard is not None:
                assert plan.group == "g" and (plan.lock_until or held.lock_until) >= POLICY.lease_from(now), \
                    "the lock would expire before the lease"
            held.outcome(plan, applied=True)
    assert served == sorted(set(served))

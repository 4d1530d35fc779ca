"""Property test of an ordered group's turn (``bucketq.core.group_turn``): consumers claim, take turns, serve,
finish or nack, end their turns and crash, every step of their conversations interleaved with everyone else's,
against the in-memory database through the generated synchronous store (the queries are the real ones). At most
one consumer serves a group at a time, a group's buckets are served in ``s`` order, and when no one crashed,
nothing is left waiting once everyone is idle: every waiting bucket got its hand-off."""

from __future__ import annotations

import datetime as dt
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from bson import ObjectId
from bson.codec_options import CodecOptions
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bucketq.core import claims, group_turn, groups
from bucketq.core.format import Slot, bucket_document, parse_bucket
from bucketq.core.group_turn import GroupStep, Turn
from bucketq.core.sharding import Spread
from bucketq.memory import MemoryClient, MemoryDatabase
from bucketq.store.sync.queue_store import QueueStore
from tests.helpers import examples

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
LEASE_S = 30.0
RETRY_S = 5.0
CONSUMERS = ["c0", "c1"]
GROUPS = ["a"]


class Clock:
    """The test's clock: time passes only by the ``time_passes`` rule."""

    def __init__(self) -> None:
        self.at = T0

    def now(self) -> dt.datetime:
        return self.at

    def earliest(self) -> dt.datetime:
        return self.at


@dataclass
class Consumer:
    """One consumer's state: the conversation under way (with the reply for its next step), the bucket it serves,
    and the claim that a turn not taken asked for instead."""

    name: str
    conversation: Generator[GroupStep, Any, Any] | None = None
    step: GroupStep | None = None
    claimed: dict | None = None  # the bucket whose turn is being taken
    serving: dict | None = None  # the bucket served, under its token
    token: str = ""  # of the bucket claimed or served
    instead: dict | None = None


class GroupTurnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        client = MemoryClient(codec_options=CodecOptions(tz_aware=True), notablescan=True)
        self.store = QueueStore(MemoryDatabase("t", client=client).sync, "q")
        self.spread = Spread()  # the buckets' partitions, as a producer gives them
        self.store.ensure_indexes()
        self.clock = Clock()
        self.consumers = {name: Consumer(name) for name in CONSUMERS}
        self.crashed = False
        self.served: dict[str, list[int]] = {g: [] for g in GROUPS}

    # -- the store, as the consumer's ``_group_step`` drives it --------------------------------------------

    def execute(self, step: GroupStep) -> Any:
        match step:
            case group_turn.LockGroup(query, update, mine):
                return self.store.lock_group(query, update, mine)
            case group_turn.ReadEarliestLive(query, sort):
                return self.store.first_bucket(query, sort)
            case group_turn.ReleaseToWait(query, update, mine):
                return self.store.update_fenced(query, update, mine=mine)
            case group_turn.Unlock(mine):
                return self.store.unlock_group(mine)
            case group_turn.ReadLock(group):
                return self.store.group_lock(group)
            case group_turn.Wake(query, update):
                return self.store.wake(query, update)
        raise AssertionError(f"unknown step {step!r}")

    def start(self, consumer: Consumer, conversation: Generator[GroupStep, Any, Any]) -> None:
        consumer.conversation = conversation
        self.advance(consumer, None)

    def advance(self, consumer: Consumer, reply: Any) -> None:
        assert consumer.conversation is not None
        try:
            consumer.step = consumer.conversation.send(reply)
        except StopIteration as done:
            consumer.conversation = consumer.step = None
            if consumer.claimed is not None:
                self.turn_taken(consumer, done.value)

    def turn_taken(self, consumer: Consumer, turn: Turn) -> None:
        bucket, consumer.claimed = consumer.claimed, None
        assert bucket is not None
        if not turn.serve:
            consumer.instead = turn.claim_instead
            return
        group = bucket["g"]
        for other in self.consumers.values():
            assert other is consumer or other.serving is None or other.serving["g"] != group, \
                f"{consumer.name} and {other.name} both serve group {group}"
        earlier = self.store.buckets.find_one({"g": group, "s": {"$lt": bucket["s"]}, **claims.LIVE})
        assert earlier is None, f"bucket s={bucket['s']} of {group} served while s={earlier['s']} is live"
        self.served[group].append(bucket["s"])
        consumer.serving = bucket

    def idle(self) -> list[str]:
        return [c.name for c in self.consumers.values() if c.conversation is None and c.serving is None]

    def busy(self) -> list[str]:
        return [c.name for c in self.consumers.values() if c.conversation is not None]

    # -- rules -----------------------------------------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS))
    def push(self, group: str) -> None:
        doc = bucket_document(ObjectId(), [Slot('"m"')], codec="json", created=self.clock.now(),
                              due=self.clock.now(), group=group)
        self.spread.assign([doc], self.store.partition_count())
        self.store.write_buckets([doc])

    @precondition(lambda self: self.idle())
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        consumer = self.consumers[data.draw(st.sampled_from(self.idle()))]
        now = self.clock.now()
        token = claims.new_token()
        spec = claims.claim(now, LEASE_S, token, consumer.name, expired_by=self.clock.earliest(), partition=0)
        if consumer.instead is not None:
            spec = groups.instead(spec, consumer.instead)
            consumer.instead = None
        doc, unclaimable = self.store.claim(spec)
        if doc is None:
            return
        assert unclaimable is None
        consumer.claimed, consumer.token = doc, token
        self.start(consumer, group_turn.take_turn(parse_bucket(doc), token, now,
                                                  now + dt.timedelta(seconds=LEASE_S), self.clock.earliest(),
                                                  waited=bool(doc.get("w"))))

    @precondition(lambda self: self.busy())
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        consumer = self.consumers[data.draw(st.sampled_from(self.busy()))]
        assert consumer.step is not None
        self.advance(consumer, self.execute(consumer.step))

    @precondition(lambda self: any(c.serving is not None and c.conversation is None for c in self.consumers.values()))
    @rule(data=st.data(), nack=st.booleans())
    def resolve(self, data: st.DataObject, nack: bool) -> None:
        """The served bucket's last write (a finish, or a release with its message's retry), then the turn ends."""
        name = data.draw(st.sampled_from([c.name for c in self.consumers.values()
                                          if c.serving is not None and c.conversation is None]))
        consumer = self.consumers[name]
        bucket, consumer.serving = consumer.serving, None
        assert bucket is not None
        now, token, ref = self.clock.now(), consumer.token, {"_id": bucket["_id"], "pt": bucket["pt"]}
        if nack:
            due = now + dt.timedelta(seconds=RETRY_S)
            applied = self.store.update_fenced(claims.fenced(ref, token),
                                               groups.release(now, token, [], due=due, retry_slot=0))
        else:
            applied = self.store.finish_fenced(claims.fenced(ref, token), claims.finish(now, token, ref["pt"]),
                                               claims.finished_by(ref, token))
        assert applied, "a live consumer's lease is kept: its last write applies"
        self.start(consumer, group_turn.end_turn(bucket["g"], bucket["pt"], token, self.clock.now()))

    @precondition(lambda self: all(c.claimed is None for c in self.consumers.values()))
    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0, 25.0]))
    def time_passes(self, seconds: float) -> None:
        """The flush loop of each live consumer keeps its lock and lease ahead of the clock (a turn is only being
        taken for a few round trips, never while time passes)."""
        until = self.clock.now() + dt.timedelta(seconds=seconds + LEASE_S)
        for consumer in self.consumers.values():
            bucket = consumer.serving
            if bucket is not None:
                ref = {"_id": bucket["_id"], "pt": bucket["pt"]}
                assert self.store.extend_group(groups.held_by(bucket["g"], consumer.token), groups.extend(until))
                assert self.store.update_fenced(claims.fenced(ref, consumer.token),
                                                {"$set": {"due": until, "lease.until": until}})
        self.clock.at += dt.timedelta(seconds=seconds)

    # -- what must hold --------------------------------------------------------------------------------------

    @invariant()
    def nothing_waits_forever(self) -> None:
        """Once everyone is idle and no one crashed, each group's earliest live bucket is not waiting for a
        hand-off: it is due (woken), or comes back by itself (a nack's retry)."""
        if self.crashed or len(self.idle()) < len(self.consumers):
            return
        for group in GROUPS:
            first = self.store.first_bucket(*groups.earliest_live(group, 0))
            assert first is None or not groups.waiting(first), f"group {group}'s bucket waits with no one to wake it"

    @invariant()
    def served_in_order(self) -> None:
        for group, places in self.served.items():
            assert places == sorted(places), f"group {group} served out of order: {places}"



class GroupTurnWithCrashesMachine(GroupTurnMachine):
    """The same, with consumers that die: their buckets' order and the groups' one server at a time still hold."""

    @precondition(lambda self: any(c.conversation is not None or c.serving is not None
                                   for c in self.consumers.values()))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A consumer dies between two writes: its lease and lock are left to expire."""
        name = data.draw(st.sampled_from([c.name for c in self.consumers.values()
                                          if c.conversation is not None or c.serving is not None]))
        self.consumers[name] = Consumer(name)
        self.crashed = True


GroupTurnMachine.TestCase.settings = settings(max_examples=examples(100), stateful_step_count=40, deadline=None)
GroupTurnWithCrashesMachine.TestCase.settings = settings(GroupTurnMachine.TestCase.settings,
                                                         max_examples=examples(50))
TestGroupTurn = GroupTurnMachine.TestCase
TestGroupTurnWithCrashes = GroupTurnWithCrashesMachine.TestCase


class Pick:
    """Stands for ``st.data()`` where a test picks the consumer itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def draw(self, strategy: Any) -> str:
        return self.name


def test_a_bucket_marked_waiting_after_the_hand_off_read_the_group_hands_off_itself() -> None:
    """The interleaving that the re-read of the lock is for (the search above finds it only rarely): c1 fails to
    take the lock that c0 holds; c0 ends its turn and its hand-off reads the group before c1 marks its bucket
    waiting; c1 then finds the lock free and wakes its bucket itself."""
    machine = GroupTurnMachine()
    machine.push("a")
    machine.push("a")
    c0, c1 = Pick("c0"), Pick("c1")
    machine.claim(c0)
    while machine.consumers["c0"].conversation is not None:
        machine.step(c0)
    assert machine.consumers["c0"].serving is not None
    machine.claim(c1)
    machine.step(c1)  # its lock is refused: c0 holds it
    assert isinstance(machine.consumers["c1"].step, group_turn.ReleaseToWait)
    machine.resolve(c0, nack=False)
    while machine.consumers["c0"].conversation is not None:
        machine.step(c0)  # unlock, then the hand-off finds c1's bucket claimed: nothing to wake
    while machine.consumers["c1"].conversation is not None:
        machine.step(c1)
    assert machine.idle() == ["c0", "c1"]
    machine.nothing_waits_forever()
    first = machine.store.first_bucket(*groups.earliest_live("a", 0))
    assert first is not None and not groups.waiting(first)

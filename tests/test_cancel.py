"""``Queue.cancel`` over a real connection (both backends): a pending message is never delivered and its record is
in the dead letters; a message a consumer holds ends as cancelled once the consumer hears of the request (its
handler sees ``message.cancelled``), not acked, not retried; lost replies on the cancel's writes; a cancel racing
consumers that claim the message (tasks, and processes) has exactly one outcome."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from bson import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

import bucketq
import bucketq.testing
from bucketq.batch import Batch, BatchQueue
from bucketq.core.cancel import still_pending
from bucketq.core.format import Slot, bucket_document, parse_bucket
from bucketq.core.held import ClaimedBucket, Policy, SlotState
from tests.format_checks import check, check_bucket
from tests.helpers import PATIENCE_S, eventually, examples, lossy_queue, served

pytestmark = pytest.mark.backends("memory", "server")

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
QUICK = {"bucket_max_wait": 0.005, "change_streams": False, "poll_interval": 0.02, "drain_timeout": 0}
# A lease short enough that a holder extends it (and so hears of requests) every half second or so.
SHORT_LEASE = {**QUICK, "lease": 1.0, "state_flush_period": 0.05}


def _record(sync_db: Any, message_id: str) -> dict | None:
    return sync_db["events.dead"].find_one({"_id": message_id})


# -- pending -----------------------------------------------------------------------------------------------------

async def test_a_cancelled_pending_message_is_never_delivered_and_its_record_is_a_dead_letter(make_queue, sync_db):
    q = make_queue(**QUICK)
    ids = await q.push_many(["keep 1", "cancel me", "keep 2"])
    assert await q.cancel(ids[1]) == "cancelled"
    assert await q.cancel(ids[1]) == "cancelled"  # a repeat (or a retry after a lost reply) says so again
    bucket = sync_db["events"].find_one()
    assert bucket["done"] == [1] and bucket["x"] == [1]
    record = _record(sync_db, ids[1])
    assert record["cancelled"] is True and record["error"] == "cancelled" and record["tries"] == 0
    assert [d["_id"] for d in await q.dead_letters()] == [ids[1]]
    stats = await q.stats()
    assert stats["ready"] == 2 and stats["dead"] == 1 and stats["cancelled"] == 1
    assert await served(make_queue(**QUICK), want=2) == ["keep 1", "keep 2"]


async def test_a_cancelled_unique_job_frees_its_key_pending_or_in_flight(make_queue, sync_db):
    producer, queue = make_queue(**QUICK), make_queue(**SHORT_LEASE)
    pending = await producer.push("report", key="report", unique_for=3600)
    assert await producer.cancel(pending) == "cancelled"
    running = await producer.push("report", key="report", unique_for=3600)
    assert running != pending, "the cancelled job's key was still held"
    message = await queue.reserve(timeout=20)
    assert message is not None and message.id == running
    assert await producer.cancel(running) == "requested"
    await asyncio.wait_for(message.wait_cancelled(), 20)
    await message.ack(wait=True)  # ends as cancelled
    assert _record(sync_db, running)["cancelled"] is True
    assert await producer.push("report", key="report", unique_for=3600) not in (pending, running)


async def test_the_documents_of_a_cancellation_match_the_format(make_queue, sync_db):
    q = make_queue(**QUICK)
    ids = await q.push_many(["keep", "cancel me"])
    assert await q.cancel(ids[1]) == "cancelled"
    check_bucket(sync_db["events"].find_one())
    check(_record(sync_db, ids[1]), "dead-fields")


async def test_a_cancelled_message_comes_back_with_requeue_dead(make_queue):
    q = make_queue(**QUICK)
    message_id = await q.push("changed my mind")
    assert await q.cancel(message_id) == "cancelled"
    assert await q.requeue_dead(ids=[message_id]) == 1
    message = await q.reserve(timeout=5)
    assert message is not None and message.id == message_id and not message.cancelled


async def test_cancel_of_an_unknown_or_finished_message_is_not_found(make_queue):
    q = make_queue(**QUICK)
    message_id = await q.push("done before")
    assert await served(q, want=1) == ["done before"]
    assert await q.cancel(message_id) == "not_found"
    assert await q.cancel("no-such-id") == "not_found"
    assert await q.cancel(f"{ObjectId()}:0") == "not_found"
    with pytest.raises(bucketq.InvalidOption, match="message_id"):
        await q.cancel("")


async def test_cancel_finds_a_nacked_message_in_its_retry_bucket(make_queue, sync_db):
    q = make_queue(**QUICK)
    message_id = await q.push("retried")
    message = await q.reserve(timeout=5)
    await message.nack(60, error="later", wait=True)
    await q.drain()
    other = make_queue(**QUICK)
    assert await other.cancel(message_id) == "cancelled"
    assert (await other.stats())["scheduled"] == 0
    assert _record(sync_db, message_id)["tries"] == 1


# -- held by a consumer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("many", [False, True], ids=["reserve", "reserve_many"])
async def test_a_message_not_yet_served_from_a_held_bucket_is_never_delivered(make_queue, sync_db, many):
    producer, consumer = make_queue(**QUICK), make_queue(**SHORT_LEASE)
    ids = await producer.push_many(["first", "second", "cancelled before its turn", "last"])
    first = await consumer.reserve(timeout=5)
    assert first is not None and first.id == ids[0]
    assert await producer.cancel(ids[2]) == "requested"
    # the consumer reads the request after a lease extension (within half a lease)
    await eventually(lambda: first._holding.held.cancel_requested(2), what="the consumer heard of the request")
    await first.ack(wait=True)
    if many:  # the second from reserve, the rest in one pass over the bucket (Held.serve_many)
        rest = await consumer.reserve_many(10, timeout=5)
    else:
        rest = [await consumer.reserve(timeout=5), await consumer.reserve(timeout=5)]
    assert [m.id for m in rest] == [ids[1], ids[3]]
    await consumer.ack_many(rest, wait=True)
    assert await consumer.reserve(timeout=0.5) is None
    await eventually(lambda: _record(sync_db, ids[2]) is not None, what="the cancellation recorded")
    assert _record(sync_db, ids[2])["cancelled"] is True
    assert await producer.cancel(ids[2]) == "cancelled"
    await eventually(lambda: sync_db["events"].find_one({"fin": {"$exists": True}}) is not None,
                     what="the bucket finished")


async def test_a_message_acked_with_ack_many_after_its_cancel_was_heard_ends_cancelled(make_queue, sync_db):
    producer, consumer = make_queue(**QUICK), make_queue(**SHORT_LEASE)
    ids = await producer.push_many(["a", "b", "c"])
    batch = await consumer.reserve_many(3, timeout=5)
    assert [m.id for m in batch] == ids
    assert await producer.cancel(ids[1]) == "requested"
    await eventually(lambda: batch[1].cancelled, what="the consumer heard of the request")
    await consumer.ack_many(batch)  # without wait: the acks of one bucket in one pass (ClaimedBucket.ack_each)
    await eventually(lambda: _record(sync_db, ids[1]) is not None, what="the cancellation recorded")
    assert _record(sync_db, ids[1])["cancelled"] is True
    assert [d["_id"] for d in await producer.dead_letters()] == [ids[1]]


async def _cancel_while_running(worker: bucketq.Worker, started: asyncio.Event, producer: bucketq.Queue,
                                message_id: str, sync_db: Any) -> None:
    """Run ``worker`` until its handler has ``started``, cancel ``message_id``, and stop the worker once the
    cancellation is recorded."""
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), 20)
        assert await producer.cancel(message_id) == "requested"
        await eventually(lambda: _record(sync_db, message_id) is not None, what="the cancellation recorded")
    finally:
        worker.stop()
        await running


@pytest.mark.parametrize("resolve", ["ack", "nack", "dead_letter", "return"])
async def test_a_running_handler_sees_the_cancel_and_its_message_ends_cancelled(make_queue, sync_db, resolve):
    producer, queue = make_queue(**QUICK), make_queue(**SHORT_LEASE)
    message_id = await producer.push("long job")
    started, seen = asyncio.Event(), []

    async def handler(message: bucketq.Message) -> None:
        started.set()
        await asyncio.wait_for(message.wait_cancelled(), 20)  # the cooperative cancel: stop the work here
        seen.append(message.cancelled)
        if resolve != "return":
            await getattr(message, resolve)()

    await _cancel_while_running(bucketq.Worker(queue, handler, handle_signals=False), started, producer, message_id,
                                sync_db)
    assert seen == [True]
    record = _record(sync_db, message_id)
    assert record["cancelled"] is True and record["error"] == "cancelled" and record["tries"] == 1
    assert await producer.cancel(message_id) == "cancelled"
    stats = await producer.stats()
    assert stats["ready"] + stats["scheduled"] + stats["in_flight"] == 0  # not retried
    assert await served(make_queue(**QUICK)) == []


async def test_with_cancel_grace_a_handler_that_ignores_the_cancel_is_cut_off(make_queue, sync_db):
    producer, queue = make_queue(**QUICK), make_queue(**SHORT_LEASE)
    message_id = await producer.push("stubborn")
    started, outcome = asyncio.Event(), []

    async def handler(message: bucketq.Message) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # never looks at message.cancelled
        except asyncio.CancelledError:
            outcome.append(message.cancelled)
            raise

    await _cancel_while_running(bucketq.Worker(queue, handler, handle_signals=False, cancel_grace=0.1), started,
                                producer, message_id, sync_db)
    assert outcome == [True]  # cut off by the grace, not by the stop
    assert _record(sync_db, message_id)["error"] == "cancelled"


@pytest.mark.parametrize("bad", [-1, "soon", float("nan")])
def test_a_bad_cancel_grace_is_invalid_option(bad):
    async def handler(message: bucketq.Message) -> None: ...
    with pytest.raises(bucketq.InvalidOption):
        bucketq.Worker(bucketq.testing.queue(), handler, cancel_grace=bad)


async def test_a_message_resolved_before_its_holder_heard_of_the_cancel_keeps_its_outcome(make_queue, sync_db):
    # no flush (nor read of requests) before the drain: the ack stays in memory while the cancel runs
    producer, consumer = make_queue(**QUICK), make_queue(**QUICK, lease=60, state_flush_period=20)
    ids = await producer.push_many(["acked first", "other"])
    message = await consumer.reserve(timeout=5)
    await message.ack()  # in memory, not yet written
    assert await producer.cancel(ids[0]) == "requested"
    assert [m.payload for m in [await consumer.reserve(timeout=5)]] == ["other"]
    await consumer.drain()
    assert _record(sync_db, ids[0]) is None  # acked: no record
    assert await producer.cancel(ids[0]) == "not_found"


async def test_a_message_nacked_before_its_holder_heard_of_the_cancel_is_cancelled_in_its_retry(make_queue, sync_db):
    producer, consumer = make_queue(**QUICK), make_queue(**QUICK, lease=60, state_flush_period=20)
    # A second message keeps the bucket unfinished: a bucket's last resolution is flushed at once, and that flush
    # would race the cancel below.
    message_id, _ = await producer.push_many(["nacked first", "left unserved"])
    message = await consumer.reserve(timeout=5)
    assert message.payload == "nacked first"
    await message.nack(60, error="later")  # in memory: its retry copy is written at the drain
    assert await producer.cancel(message_id) == "requested"
    await consumer.drain()
    # Counted by the consumer's clock, which dated the drain's release: by the producer's, whose latest reading may
    # be a millisecond behind the consumer's estimate, the unserved message can count as scheduled for a moment.
    assert (await consumer.stats())["scheduled"] == 1  # the nack kept its outcome
    assert await producer.cancel(message_id) == "cancelled"  # found in its retry bucket
    assert (await consumer.stats())["scheduled"] == 0
    assert _record(sync_db, message_id)["cancelled"] is True


async def test_cancelling_a_message_of_an_ordered_group_lets_the_group_go_on(make_queue):
    q = make_queue(**QUICK)
    ids = await q.push_many([bucketq.Outgoing(step, group="order-17") for step in ("created", "paid", "shipped")])
    assert await q.cancel(ids[1]) == "cancelled"
    assert await served(make_queue(**QUICK), want=2) == ["created", "shipped"]


# -- lost replies ------------------------------------------------------------------------------------------------

@pytest.fixture
def lossy(backend: str, request: pytest.FixtureRequest, make_queue: Any) -> Any:
    """(a queue whose connection can lose replies, ``lose_reply(command, collection)``): ``lossy_queue``."""
    return lossy_queue(backend, make_queue, request, **QUICK)


@pytest.mark.parametrize("command", ["findAndModify", "update"])
async def test_a_cancel_whose_reply_was_lost_reports_cancelled_and_records_once(lossy, make_queue, sync_db, command):
    q, lose_reply = lossy
    ids = await q.push_many(["keep", "cancel me"])
    lost = lose_reply(command, "events")  # the request (retried), or the removal (read again)
    assert await q.cancel(ids[1]) == "cancelled"
    assert lost.hits == 1
    assert sync_db["events"].find_one()["done"] == [1]
    assert sync_db["events.dead"].count_documents({}) == 1
    assert await q.cancel(ids[1]) == "cancelled"
    assert await served(make_queue(**QUICK), want=1) == ["keep"]


async def test_a_crash_between_the_record_and_the_removal_leaves_the_next_claimant_to_cancel(make_queue, sync_db):
    q = make_queue(**QUICK)
    ids = await q.push_many(["keep", "cancel me"])
    sync_db["events"].update_one({}, {"$addToSet": {"x": 1}})  # the request got through, then the canceller died
    assert await served(make_queue(**QUICK), want=1) == ["keep"]
    assert _record(sync_db, ids[1])["cancelled"] is True
    assert await q.cancel(ids[1]) == "cancelled"


# -- batch consumers ---------------------------------------------------------------------------------------------

def _batch_claim(queue_target: Any, db_name: str) -> tuple[Batch | None, list[Any]]:
    """A ``BatchQueue`` claim, once the released bucket is due by its clock (see tests/spark/test_batch_queue.py,
    ``_claim_released``); the claimed documents as stored once the claim returned."""
    with BatchQueue(queue_target, name="events", db=db_name) as bq:
        deadline = time.monotonic() + PATIENCE_S
        while (batch := bq.claim(10)) is None and bq.store.buckets.count_documents({"fin": None}):
            assert time.monotonic() < deadline, f"no bucket came due in {PATIENCE_S} s"
            time.sleep(0.005)
        return batch, [] if batch is None else list(bq.store.buckets.find({"_id": {"$in": batch.ids}}))


async def test_a_batch_claim_never_hands_out_a_message_whose_cancellation_was_requested(make_queue, sync_db,
                                                                                      queue_target, db_name):
    """The request reached the bucket while a consumer held it, and the consumer stopped before it heard of it: the
    next claimant is a batch job's, whose claim ends the message as cancelled (its record, its slot done) rather
    than handing it to Spark, and hands out the rest."""
    consumer = make_queue(**QUICK)
    ids = await consumer.push_many(["served", "cancel me", "for the batch"])
    message = await consumer.reserve(timeout=5)
    assert message is not None and message.id == ids[0]
    await message.ack(wait=True)
    assert await consumer.cancel(ids[1]) == "requested"
    await consumer.drain()  # the bucket is released with the request on it
    batch, docs = _batch_claim(queue_target, db_name)
    assert batch is not None and batch.messages == 1
    assert [sorted(doc["done"]) for doc in docs] == [[0, 1]]  # what Spark reads: slot 2 alone
    assert _record(sync_db, ids[1])["cancelled"] is True


async def test_a_batch_claim_of_a_bucket_whose_every_message_was_cancelled_finishes_it(make_queue, sync_db,
                                                                                      queue_target, db_name):
    q = make_queue(**QUICK)
    ids = await q.push_many(["cancel me"])
    sync_db["events"].update_one({}, {"$addToSet": {"x": 0}})  # the request got through, then the canceller died
    batch, _ = _batch_claim(queue_target, db_name)
    assert batch is None
    assert "fin" in sync_db["events"].find_one()
    assert _record(sync_db, ids[0])["cancelled"] is True


# -- racing ------------------------------------------------------------------------------------------------------

async def _serve_one(q: bucketq.Queue, acked: list[str], ended: Callable[[], bool]) -> None:
    """Take one message, unless it ``ended`` first (served by the other consumer, or cancelled), and ack it;
    ``acked`` gets its id when its handler did not know of a cancel (an ack as a success). The loser of the race
    stops when the message ends, rather than waiting out a timeout of its own in every round."""
    while not ended():
        message = await q.reserve(timeout=0.05)
        if message is not None:
            if not message.cancelled:
                acked.append(message.id)
            await message.ack(wait=True)
            return


def _ended(sync_db: Any, message_id: str) -> bool:
    """Whether the message's slot is done or its bucket finished (the record of a cancellation, if any, is written
    before either)."""
    bucket_id, slot = message_id.split(":")
    doc = sync_db["events"].find_one({"_id": ObjectId(bucket_id)})
    return "fin" in doc or int(slot) in doc["done"]


async def test_a_cancel_racing_consumers_has_exactly_one_outcome(make_queue, sync_db):
    """Many rounds of a cancel against two consumers claiming the same message: the message is either cancelled
    (a record, and no handler resolved it as a success) or handled as if not cancelled (acked, no record),
    never both, and never lost."""
    producer = make_queue(**QUICK)
    consumers = [make_queue(**SHORT_LEASE), make_queue(**SHORT_LEASE)]
    outcomes: Counter[str] = Counter()
    for round_ in range(15):
        message_id = await producer.push(round_)
        acked: list[str] = []
        ended = functools.partial(_ended, sync_db, message_id)
        outcome, *_ = await asyncio.gather(producer.cancel(message_id),
                                           *(_serve_one(q, acked, ended) for q in consumers))
        await eventually(ended, what="the message ended")
        recorded = _record(sync_db, message_id) is not None
        outcomes[outcome] += 1
        if outcome == "cancelled":  # never delivered as a live message
            assert recorded and not acked
        elif outcome == "not_found":  # handled and finished before the cancel read it
            assert acked and not recorded
        else:  # the holder decided: one of the two, never both
            assert outcome == "requested" and recorded != bool(acked), (recorded, acked)
    for q in consumers:
        await q.drain()
    assert (await producer.stats())["ready"] == 0
    assert outcomes["cancelled"] + outcomes["requested"] > 0, outcomes  # the race was run, not always lost


def _run_consumer(mongo_uri: str, db_name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.entrypoints.consumer_proc", mongo_uri, db_name, "events"])


@pytest.mark.timeout(120)
async def test_cancels_racing_two_consumer_processes_end_each_message_once(make_queue, sync_db, mongo_uri, db_name):
    """Two consumer processes serve 600 messages while this one cancels every third: each message ends exactly
    once, as cancelled (its record) or as handled (acked, no record), as ``cancel`` reported."""
    q = make_queue(**QUICK, bucket_max_size=20)
    total = 600
    ids = await q.push_many({"i": i} for i in range(total))
    procs = [_run_consumer(mongo_uri, db_name) for _ in range(2)]
    outcomes = {}
    for i in range(0, total, 3):
        outcomes[i] = await q.cancel(ids[i])
    for proc in procs:
        assert await asyncio.to_thread(proc.wait, 90) == 0
    handled = defaultdict(list)
    for r in sync_db.processed.find():
        handled[r["i"]].append(r)
    recorded = {d["_id"] for d in sync_db["events.dead"].find({"cancelled": True})}
    assert all(len(rs) == 1 for rs in handled.values()), "a message handled twice"
    for i, message_id in enumerate(ids):
        acked = i in handled and not handled[i][0]["cancelled"]
        assert acked != (message_id in recorded), f"message {i}: acked {acked}, cancelled {message_id in recorded}"
        if i % 3:
            assert acked, f"message {i} was not cancelled, yet not handled"
        elif outcomes[i] == "cancelled":
            assert i not in handled, f"message {i} reported cancelled while pending was delivered"
        elif outcomes[i] == "not_found":
            assert acked
    assert sync_db.events.count_documents({"fin": {"$exists": False}}) == 0
    assert Counter(outcomes.values())["cancelled"] > 0


# -- the state machine (no database) ----------------------------------------------------------------------------

@settings(max_examples=examples(200), deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["serve", "ack", "nack", "dead", "cancel", "flush"]),
                                st.integers(0, 3)), max_size=40))
def test_a_slot_ends_cancelled_exactly_when_its_request_was_known_before_it_was_resolved(steps):
    policy = Policy(lease=30.0, max_attempts=5, granularity=1.0)
    doc = bucket_document(ObjectId(), [Slot(f'"{i}"') for i in range(4)], codec="json", created=T0, due=T0)
    doc["c"] = 1
    held = ClaimedBucket(parse_bucket(doc), "token", policy.lease_from(T0), policy)
    known: set[int] = set()  # requests the claim knew of
    served: set[int] = set()
    expect: dict[int, bool] = {}  # slot -> whether it must end cancelled, fixed when it is resolved
    records: dict[int, dict] = {}
    for action, slot in steps:
        if action == "serve" and (s := held.serve(T0)) is not None:
            assert s not in known, "a slot whose cancellation was known was handed out"
            served.add(s)
        elif action in ("ack", "nack", "dead") and slot in served and slot not in expect:
            {"ack": held.ack, "nack": lambda s: held.nack(s, T0), "dead": lambda s: held.dead(s, "no")}[action](slot)
            expect[slot] = slot in known
        elif action == "cancel":
            woken = held.learn_cancels([slot])
            assert woken == ([slot] if slot in served and slot not in expect and slot not in known else [])
            known.add(slot)
        elif action == "flush":
            plan = held.take_plan(T0)
            records.update({int(d["_id"].rsplit(":", 1)[1]): d for d in plan.dead_docs})
            held.outcome(plan, True)
            if held.ended:
                break
    while held.serve(T0) is not None:  # what is left: unserved slots whose cancellation is known end at once
        pass
    for s in range(4):
        if s in known and s not in served:
            expect[s] = True
    plan = held.take_plan(T0)
    records.update({int(d["_id"].rsplit(":", 1)[1]): d for d in plan.dead_docs})
    for s, cancelled in expect.items():
        record = records.get(s)
        assert (record is not None and record.get("cancelled") is True) == cancelled, (s, record)
        if cancelled:
            assert record["error"] == "cancelled" and plan.slots.get(s, SlotState.DEAD) is SlotState.DEAD


def test_a_request_that_returned_a_tombstone_or_a_done_slot_reads_the_bucket_again():
    """mongo-java-server's findAndModify can match a live bucket and return the tombstone a concurrent finish left
    (it failed once in the racing test, on the records of a tombstone): such a reply is not acted on."""
    live = {"_id": ObjectId(), "done": [0], "n": 3}
    assert still_pending(live, [1, 2])
    assert not still_pending(live, [0])
    assert not still_pending({"_id": live["_id"], "v": 1, "fin": {"token": "t", "at": T0}, "lease": None}, [1])
    assert not still_pending(None, [1])

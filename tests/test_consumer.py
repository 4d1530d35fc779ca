"""The consume path over a real connection: claims, leases, per-message ack/nack, retries, dead letters,
quarantine, wake-ups, drain, dedupe and crashes."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import time
from collections import Counter, defaultdict
from itertools import pairwise
from typing import Any

import pytest
from bson import ObjectId
from pymongo.errors import OperationFailure

import bucketq
from bucketq.core.format import BSON_LIMIT, FORMAT_VERSION
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.queue_store import AsyncQueueStore
from tests.helpers import (
    PATIENCE_S,
    LosableWatch,
    StartedCommands,
    consume_all,
    eventually,
    next_message,
    seconds_ago,
    utc_now,
)

pytestmark = pytest.mark.backends("memory", "server")


async def test_reserve_ack_empties_the_queue_and_deletes_buckets(make_queue, sync_db):
    q = make_queue(bucket_max_size=100)
    await q.push_many({"i": i} for i in range(1000))
    got = []
    for _ in range(1000):  # each acked as served, its ack written with the next flush
        got.append(message := await next_message(q))
        await message.ack()
    assert sorted(m.payload["i"] for m in got) == list(range(1000))
    assert all(m.tries == 0 for m in got)
    await q.drain()
    assert sync_db.events.count_documents({"fin": {"$exists": False}}) == 0
    assert (await q.stats())["buckets"] == 0


async def test_message_fields(make_queue):
    q = make_queue(bucket_max_wait=0.01)
    message_id = await q.push({"a": 1}, headers={"trace": "t-1"}, key="k-1")
    message = await q.reserve(timeout=2)
    assert message.id == message_id
    assert (message.payload, message.headers, message.key, message.tries) == ({"a": 1}, {"trace": "t-1"}, "k-1", 0)
    assert abs((q._clock.now() - message.enqueued_at).total_seconds()) < 5
    await message.ack()
    with pytest.raises(bucketq.AlreadyResolved):
        await message.ack()


async def test_a_message_without_headers_keeps_the_one_dict_a_handler_adds_to(make_queue):
    """Messages read their fields from the bucket when asked: headers must still be one dict a message."""
    q = make_queue(bucket_max_wait=0.01)
    await q.push_many([1, 2])
    first, second = await q.reserve_many(2, timeout=2)
    first.headers["seen_by"] = "middleware"
    assert first.headers == {"seen_by": "middleware"} and second.headers == {}
    assert (first.key, first.tries, second.id.endswith(":1")) == (None, 0, True)
    await first.ack()
    await second.ack()


async def test_pop_and_consume(make_queue):
    q = make_queue(bucket_max_wait=0.01)
    await q.push_many([1, 2, 3])
    assert (await q.pop(timeout=2)).payload == 1
    seen = [m.payload async for m in _acking(q.consume(idle_timeout=0.3))]
    assert seen == [2, 3]


async def _acking(messages):
    async for message in messages:
        await message.ack()
        yield message


async def test_nacked_message_returns_after_its_delay_while_siblings_go_on(make_queue):
    q = make_queue(bucket_max_wait=0.01)
    await q.push_many(["a", "b", "c"])
    first = await q.reserve(timeout=2)
    await first.nack(delay=1.0)
    nacked_at = time.monotonic()
    siblings = [await q.reserve(timeout=0.9) for _ in range(2)]
    assert [m and m.payload for m in siblings] == ["b", "c"], "siblings were held back by the nack"
    assert time.monotonic() - nacked_at < 1.0, "the siblings came only once the nack's delay was over"
    for message in siblings:
        await message.ack()
    again = await q.reserve(timeout=20)
    waited = time.monotonic() - nacked_at
    assert again.payload == "a" and again.id == first.id
    assert again.tries == 1
    # not before its delay; and well before anything else would bring it back (its lease ends after 30 s)
    assert 1.0 - 0.05 <= waited < 15, f"came back after {waited:.2f}s, not its own 1 s delay"
    await again.ack()


async def test_each_message_has_its_own_tries(make_queue):
    q = make_queue(bucket_max_wait=0.01, max_attempts=10)
    await q.push_many(["x", "y"])
    x = await q.reserve(timeout=2)
    y = await q.reserve(timeout=2)
    await x.nack(delay=0)
    await y.ack()
    for expected in (1, 2):
        x = await q.reserve(timeout=2)
        assert (x.payload, x.tries) == ("x", expected)
        await x.nack(delay=0)
    x = await q.reserve(timeout=2)
    assert x.tries == 3
    await x.ack()


async def test_dead_letter_after_max_attempts_keeps_the_reason(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.01, max_attempts=2)
    message_id = await q.push({"poison": True}, headers={"h": 1})
    for _ in range(2):
        message = await q.reserve(timeout=2)
        await message.nack(delay=0, error=ValueError("bad amount"), wait=True)
    assert await q.reserve(timeout=0.3) is None
    dead = await q.dead_letters()
    assert len(dead) == 1
    entry = dead[0]
    assert entry["_id"] == message_id
    assert entry["tries"] == 2
    assert entry["error"] == "ValueError: bad amount"
    # The id is the original one; origin is where it was when it died (here: the retry bucket of its nack).
    assert isinstance(entry["origin"]["bucket"], ObjectId) and entry["origin"]["slot"] == 0
    assert entry["h"] == {"h": 1}
    assert (await q.stats())["dead"] == 1
    assert await q.dead_letters(error_contains="nothing like it") == []
    assert await q.requeue_dead(error_contains="bad amount") == 1
    again = await q.reserve(timeout=2)
    assert (again.id, again.payload, again.tries) == (message_id, {"poison": True}, 0)
    await again.ack()
    assert (await q.stats())["dead"] == 0


async def test_purge_dead(make_queue):
    q = make_queue(bucket_max_wait=0.01, max_attempts=1)
    await q.push_many([1, 2])
    for _ in range(2):
        await (await q.reserve(timeout=2)).nack(wait=True, error="nope")
    assert len(await q.dead_letters()) == 2
    assert await q.purge_dead(older_than=3600) == 0
    assert await q.purge_dead() == 2


def _insert_raw(sync_db, doc):
    base = {"_id": ObjectId(), "v": FORMAT_VERSION, "enc": "json", "due": seconds_ago(), "created": seconds_ago(),
            "n": 2, "p": ['{"ok":1}', '{"ok":2}'], "done": [], "c": 0, "lease": None}
    base.update(doc)
    sync_db.events.insert_one({k: v for k, v in base.items() if v is not ...})
    return base["_id"]


@pytest.mark.parametrize("corruption, reason", [
    ({"v": 99}, "format version 99"),
    ({"p": "not an array"}, "p must be"),
    ({"n": 7}, "n is 7"),
    ({"enc": "rot13"}, "unknown codec"),
    ({"p": ['{"ok":1}', "{broken json"]}, "undecodable"),
    ({"created": ...}, "created must be"),
])
async def test_malformed_bucket_goes_to_quarantine_and_the_consumer_goes_on(make_queue, sync_db, corruption, reason):
    q = make_queue(bucket_max_wait=0.01)
    bad_id = _insert_raw(sync_db, corruption)
    await q.push({"good": True})
    got = await consume_all(q, want=1)
    assert [m.payload for m in got] == [{"good": True}]
    entries = await q.quarantined()
    assert len(entries) == 1
    entry = entries[0]
    assert entry["_id"] == bad_id and entry["kind"] == "bucket"
    assert reason in entry["reason"]
    assert entry["doc"]["_id"] == bad_id and entry["host"] and entry["pid"]
    assert sync_db.events.count_documents({"_id": bad_id, "fin": {"$exists": False}}) == 0, \
        "a quarantined bucket must leave the queue"


async def test_skip_mode_quarantines_only_the_bad_message(make_queue, sync_db):
    q = make_queue(malformed="skip")
    bad_id = _insert_raw(sync_db, {"p": ['{"ok":1}', "{broken", '{"ok":3}'], "n": 3})
    got = await consume_all(q, want=2)
    assert [m.payload for m in got] == [{"ok": 1}, {"ok": 3}]
    await q.drain()
    entries = await q.quarantined()
    assert [(e["kind"], e["_id"]) for e in entries] == [("message", f"{bad_id}:1")]
    assert sync_db.events.count_documents({"fin": {"$exists": False}}) == 0


@pytest.mark.parametrize("many", [False, True], ids=["reserve", "reserve_many"])
@pytest.mark.parametrize("malformed", ["quarantine", "skip"])
async def test_a_checked_buckets_undecodable_message_goes_to_quarantine_alone_as_it_is_served(make_queue, sync_db,
                                                                                             malformed, many):
    """A bucket marked ``pc: true`` is decoded a payload at a time as served, not whole at its claim: one that fails
    anyway (its writer marked it wrongly) goes to quarantine alone, whatever ``malformed`` says, and the rest of the
    bucket is served (docs/FORMAT.md, "Payloads checked by the writer"). The last one fails too, so that its
    quarantine is what finishes the bucket."""
    q = make_queue(malformed=malformed)
    bad_id = _insert_raw(sync_db, {"p": ['{"ok":1}', "{broken", '{"ok":3}', "[1,"], "n": 4, "pc": True})
    if many:
        got = await q.reserve_many(10, timeout=PATIENCE_S)
        await q.ack_many(got, wait=True)
        assert await q.reserve(timeout=0.1) is None
    else:
        got = await consume_all(q, want=2)
    assert [m.payload for m in got] == [{"ok": 1}, {"ok": 3}]
    await q.drain()
    entries = await q.quarantined()
    assert sorted((e["kind"], e["_id"]) for e in entries) == [("message", f"{bad_id}:1"), ("message", f"{bad_id}:3")]
    assert all(e["reason"].startswith("undecodable: ") for e in entries)
    assert sync_db.events.count_documents({"fin": {"$exists": False}}) == 0, "the bucket must be finished"


@pytest.mark.parametrize("codec", ["json", "msgpack", "bson"])
async def test_pushed_buckets_are_marked_checked_and_their_retries_keep_the_mark(make_queue, sync_db, codec):
    q = make_queue(codec=codec, bucket_max_wait=0.01)
    await q.push_many([{"i": 1}, {"i": 2}])
    assert [doc.get("pc") for doc in sync_db.events.find()] == [True]
    message = await q.reserve(timeout=PATIENCE_S)
    assert message is not None and message.payload == {"i": 1}
    await message.nack(delay=0, wait=True)
    assert sync_db.events.find_one({"o": message.id})["pc"] is True


class _UncheckedCodec:
    """A user's codec that does not say it checks what it dumps."""

    name = "unchecked"

    def dump(self, payload: Any) -> str:
        return str(payload)

    def load(self, stored: Any) -> Any:
        return stored


async def test_buckets_not_checked_by_their_writer_are_not_marked_nor_are_their_retries(make_queue, sync_db):
    q = make_queue(codec=_UncheckedCodec(), bucket_max_wait=0.01)
    await q.push_many(["a", "b"])
    assert [doc.get("pc") for doc in sync_db.events.find()] == [None]
    raw_id = _insert_raw(sync_db, {})  # a bucket of another writer's, unmarked
    retried = set()
    for _ in range(3):  # one of each bucket's messages retried
        message = await q.reserve(timeout=PATIENCE_S)
        assert message is not None
        if message._holding.held.bucket.id not in retried:
            retried.add(message._holding.held.bucket.id)
            await message.nack(delay=60, wait=True)
        else:
            await message.ack()
    assert raw_id in retried and len(retried) == 2
    copies = list(sync_db.events.find({"o": {"$exists": True}}))
    assert len(copies) == 2 and all("pc" not in doc for doc in copies)


async def test_requeue_quarantined_bucket(make_queue, sync_db):
    q = make_queue()
    _insert_raw(sync_db, {"v": 99})
    assert await consume_all(q, timeout=0.3) == []
    assert await q.requeue_quarantined() == 1
    assert sync_db.events.count_documents({"v": 99}) == 1


async def test_stale_consumers_flush_is_refused(make_queue, sync_db):
    slow = make_queue(lease=1.0, state_flush_period=0.3, bucket_max_wait=0.01)
    fast = make_queue(lease=1.0, state_flush_period=0.3)
    await slow.push_many(["a", "b"])
    message = await slow.reserve(timeout=2)
    slow._consumer._flushing.stop()  # the slow consumer hangs: it stops extending its lease
    taken = await fast.reserve(timeout=5)  # once the lease has run out: fast knows when it ends
    assert taken is not None and taken.payload == "a", "the expired lease was not claimable"
    assert taken.tries == 1
    with pytest.raises(bucketq.LeaseLost):
        await message.ack(wait=True)
    with pytest.raises(bucketq.LeaseLost):
        await message.ack()
    doc = sync_db.events.find_one()
    assert doc["done"] == [] and doc["lease"]["token"] != message._holding.held.token
    await taken.ack()
    rest = await fast.reserve(timeout=1)
    assert rest.payload == "b"
    await rest.ack()


async def test_drain_hands_back_unserved_messages_with_no_tries_added(make_queue, sync_db):
    first = make_queue(bucket_max_wait=0.01)
    await first.push_many(range(10))
    message = await first.reserve(timeout=2)
    await message.ack()
    started = time.monotonic()
    await first.drain()
    assert time.monotonic() - started < 5, "drain waited for drain_timeout (10 s) with no handler in flight"
    doc = sync_db.events.find_one()
    assert doc["lease"] is None and doc["done"] == [0] and doc["c"] == 0
    second = make_queue()
    got = await consume_all(second, want=9)
    assert [m.payload for m in got] == list(range(1, 10))
    assert all(m.tries == 0 for m in got)


async def test_next_bucket_is_claimed_ahead_while_one_is_served_and_handed_back_on_drain(make_queue, sync_db):
    q = make_queue(bucket_max_size=10, bucket_max_wait=0.01)
    await q.push_many(range(40))  # four buckets
    got = [await q.reserve(timeout=2) for _ in range(11)]  # the first bucket, then the first of the second
    await q._consumer._claiming.ahead_landed()
    # Buckets written in the same millisecond are due alike: which one a claim takes among them is the server's
    # choice, so the test counts the buckets never claimed (``c`` is 0).
    assert sync_db.events.count_documents({"c": 0}) == 1, "a backlog: one bucket is claimed ahead, and no more"
    got += [await q.reserve(timeout=2) for _ in range(9)]
    served = [m.payload for m in got]
    buckets = sorted({p // 10 for p in served})
    assert len(buckets) == 2 and len(served) == 20, "two whole buckets: the first, then one claimed ahead"
    assert all([p for p in served if p // 10 == b] == list(range(b * 10, b * 10 + 10)) for b in buckets), \
        "each bucket served whole, in slot order"
    await asyncio.gather(*(m.ack() for m in got))
    await q.drain()
    unfinished = list(sync_db.events.find({"fin": {"$exists": False}}))
    assert len(unfinished) == 2 and all(d["lease"] is None and d["c"] == 0 for d in unfinished), \
        "the bucket claimed ahead goes back unserved, with no try counted"
    other = make_queue()
    rest = sorted(set(range(40)) - set(served))
    assert sorted(m.payload for m in await consume_all(other, want=len(rest))) == rest


@pytest.mark.parametrize("pause_read_due", [False, True], ids=["pause-known", "pause-read-first"])
async def test_claim_ahead_goes_out_while_handlers_that_never_await_io_serve(make_queue, sync_db, mongo_uri,
                                                                            pause_read_due):
    # On the server only: it applies a claim as soon as the request arrives, while the in-memory database runs
    # operations on the event loop these handlers never give back.
    q = make_queue(bucket_max_size=100, bucket_max_wait=0.01)
    await q.push_many(range(300))
    for _ in range(100):  # the first bucket
        await (await q.reserve(timeout=PATIENCE_S)).ack()
    if pause_read_due:  # as after an event on the control document: the claim ahead reads the pause state first
        q._pause.changed()
    seen = []

    def claimed_ahead_within(seconds: float) -> bool:
        """Whether the server applies the claim ahead (no bucket left unclaimed) within ``seconds``; blocking, as
        handlers that compute are: the event loop does not run meanwhile."""
        deadline = time.monotonic() + seconds
        while sync_db.events.count_documents({"c": 0}) != 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    async def handler_that_never_awaits_io() -> None:
        for _ in range(40):
            message = await q.reserve(timeout=PATIENCE_S)
            # a share of the patience at each message: a loaded machine's server may take seconds to apply it
            seen.append(claimed_ahead_within(PATIENCE_S / 80))
            await message.ack()

    await asyncio.gather(handler_that_never_awaits_io(), handler_that_never_awaits_io())
    # Bucket 2 alone serves these 80 reserves: a claim ahead held back until it is served is seen by none.
    assert any(seen), "the claim ahead waited for a handler that never yields to serve all its messages"


async def test_a_first_claim_of_a_bucket_written_under_load_already_claims_ahead(make_queue, sync_db):
    q = make_queue(bucket_max_size=100, bucket_max_wait=0.01)
    await q.push_many(range(300))
    first = await q.reserve(timeout=2)
    await q._consumer._claiming.ahead_landed()
    assert sync_db.events.count_documents({"c": 0}) == 1, "the first bucket, a full one, and one ahead"
    await first.ack()


async def test_a_consumer_serving_from_held_buckets_resyncs_its_clock_at_its_claims_ahead(make_queue):
    """A reserve with a message at hand does not look at the clock's age: the claims do, the claim ahead too, so
    that a consumer that always has a message at hand still resyncs (``RESYNC_EVERY_S``)."""
    from bucketq.shell.clock import RESYNC_EVERY_S

    q = make_queue(bucket_max_size=100, bucket_max_wait=0.01)
    await q.push_many(range(300))
    messages = [await q.reserve(timeout=2)]
    await q._consumer._claiming.ahead_landed()  # the second bucket is held
    held = [holding.held.bucket.id for holding in q._consumer._holdings]
    assert len(held) == 2
    synced_at = q._clock._synced_at
    assert synced_at is not None
    q._clock._synced_at = synced_at - RESYNC_EVERY_S - 1
    assert q._clock.stale
    while len(messages) < 101:  # the first bucket's, then the second's first, which sends a claim ahead
        messages.append(await q.reserve(timeout=0))
    await q._consumer._claiming.ahead_landed()
    assert not q._clock.stale and q._clock._synced_at > synced_at
    # Every one came from the two buckets held before the clock aged, the first's 100 then one of the second's
    # (which two of the three buckets, written at once, the claims took is the server's choice).
    assert [m._holding.held.bucket.id for m in messages] == [held[0]] * 100 + [held[1]], \
        "a reserve claimed: the clock's resync would not be the claim ahead's"
    await q.ack_many(messages)


async def test_no_claim_ahead_while_buckets_come_one_at_a_time(make_queue):
    q = make_queue(bucket_max_wait=0.01)
    for i in range(3):
        await q.push(i)
        message = await q.reserve(timeout=2)
        await message.ack()
        assert await q.reserve(timeout=0.05) is None
    assert q._consumer._claiming.ahead is None, "an empty claim ahead per bucket: commands a trickle does not need"


async def test_drain_nacks_handlers_that_do_not_finish(make_queue):
    q = make_queue(bucket_max_wait=0.01, drain_timeout=0.2, retry_base=0)
    await q.push_many([1, 2])
    await q.reserve(timeout=2)  # never resolved
    await q.drain()
    other = make_queue()
    got = await consume_all(other, want=2)
    assert sorted((m.payload, m.tries) for m in got) == [(1, 1), (2, 0)]


async def test_idle_consumer_is_woken_by_the_change_stream(make_queue, monkeypatch):
    """How soon is the bench's; here, that the stream wakes it: no poll comes within 30 s of a claim attempt
    (with a stream the safety poll is 40 s away at least), so a delivery within 10 s came by the stream (a
    generous bound, that a loaded machine cannot miss)."""
    monkeypatch.setattr("bucketq.shell.wakeup.POLL_FIRST_S", 30.0)
    consumer = make_queue()
    producer = make_queue(bucket_max_wait=0.2)
    assert await consumer.reserve(timeout=0.3) is None  # idle, change stream running
    latencies = []
    for i in range(3):
        waiter = asyncio.ensure_future(consumer.reserve(timeout=20))
        await asyncio.sleep(0.3)
        pushed = time.monotonic()
        producer.push_nowait({"i": i})
        message = await waiter
        latencies.append(time.monotonic() - pushed)
        await message.ack()
    assert consumer._wakeup.streaming
    assert max(latencies) < 10, f"delivery latencies {latencies}: a poll delivered, not the stream"


@pytest.mark.needs("change_streams")
async def test_a_change_stream_lost_after_streams_worked_starts_again_at_the_next_claim(make_queue):
    """As after a server restart: the buckets' stream fails; the next claim starts it again (only then: a
    consumer asks before each claim, at the cost of one attribute read while nothing was lost)."""
    q = make_queue(bucket_max_wait=0.01)
    losable = LosableWatch(q._watches[0].watch)
    q._watches[0] = losable
    assert await q.reserve(timeout=0.05) is None
    await eventually(lambda: q._wakeup.streaming, what="the change streams answering")
    first = q._wakeup._feeds[0][0]
    losable.lose()
    await eventually(lambda: first.ended, what="the stream's watch ending")
    assert not q._wakeup.streaming
    await asyncio.sleep(0.05)
    assert q._wakeup._feeds[0][0] is first, "started again before any claim"
    assert await q.reserve(timeout=0) is None  # claims once, wake-up or not
    assert q._wakeup._feeds[0][0] is not first
    await eventually(lambda: q._wakeup.streaming, what="the restarted stream answering")
    await q.push(1)
    message = await q.reserve(timeout=PATIENCE_S)
    assert message is not None and message.payload == 1
    await message.ack()


class _FixedClock:
    def __init__(self) -> None:
        self.at = utc_now()

    def now(self) -> dt.datetime:
        return self.at


@pytest.mark.needs("change_streams")
async def test_wakeup_stream_outlives_inserts_too_big_to_return_whole(adb, caplog):
    """The stream asks for no document bodies. With them, these three near-16 MiB inserts, replayed at once,
    make a reply over the test server's 48 MB limit, and each event is over real MongoDB's 16 MiB; either
    error used to turn the stream off (polling instead), for good."""
    clock = _FixedClock()  # the stream starts a second before this: every insert below is replayed to it
    await adb.buckets.insert_many([{"p": "x" * (BSON_LIMIT - 100)} for _ in range(3)])
    wakeup = Wakeup(poll_interval=1.0)
    wakeup.start_stream(AsyncQueueStore(adb, "buckets").watch_changes, clock, required=True)
    try:
        deadline = time.monotonic() + 20
        while not wakeup.streaming and wakeup.watching and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert wakeup.streaming
        assert "polling instead" not in caplog.text
    finally:
        await wakeup.stop()


async def test_idle_consumer_wakes_by_polling_without_change_streams(make_queue):
    """How soon is the bench's; here, that polls find the message (the reserve waits up to 20 s)."""
    consumer = make_queue(change_streams=False, poll_interval=0.1)
    producer = make_queue(bucket_max_wait=0.2)
    assert await consumer.reserve(timeout=0.5) is None
    waiter = asyncio.ensure_future(consumer.reserve(timeout=20))
    producer.push_nowait("hello")
    message = await waiter
    assert message is not None and message.payload == "hello"
    assert not consumer._wakeup.streaming
    await message.ack()


async def test_stats_counts_messages_by_state(make_queue):
    q = make_queue(bucket_max_wait=0.01, lease=30)
    await q.push_many(range(5))
    await q.push("later", delay=60)
    stats = await q.stats()
    assert set(stats) == {"ready", "scheduled", "in_flight", "dead", "quarantined", "buckets", "oldest_ready_age_s",
                          "ready_by_priority", "pending", "cancelled", "groups", "not_buckets", "rate_limit"}
    assert (stats["ready"], stats["scheduled"], stats["in_flight"], stats["buckets"]) == (5, 1, 0, 2)
    assert stats["pending"] == 5  # ready + in flight: the delayed one needs no worker yet
    message = await q.reserve(timeout=2)
    stats = await q.stats()
    assert (stats["ready"], stats["in_flight"], stats["pending"]) == (0, 5, 5)
    await message.ack(wait=True)
    assert (await q.stats())["in_flight"] == 4


async def test_dedupe_skips_a_known_key(make_queue):
    q = make_queue(bucket_max_wait=0.01, dedupe=True)
    await q.push({"n": 1}, key="order-1")
    await (await q.reserve(timeout=2)).ack()
    await q.push({"n": 2}, key="order-1")  # the same order, sent again
    await q.push({"n": 3}, key="order-2")
    got = await consume_all(q, want=1)
    assert [m.payload for m in got] == [{"n": 3}]


async def test_state_flushes_are_periodic_not_per_message(make_queue, mongo_uri, db_name):
    from pymongo import AsyncMongoClient

    producer = make_queue(bucket_max_size=1000)
    await producer.push_many(range(10_000))
    listener = StartedCommands()
    client = AsyncMongoClient(mongo_uri, event_listeners=[listener], tz_aware=True)
    q = bucketq.Queue(client, name="events", db=db_name, change_streams=False)
    for _ in range(10_000):  # acks not waited for: their writes are what this test counts
        message = await next_message(q)
        await message.ack()
    await q.close()
    await client.close()
    counts = Counter(event.command_name for event in listener.events)
    writes = counts["findAndModify"] + counts["update"] + counts["delete"]
    assert writes <= 10 * 3 + 5, f"{dict(counts)}: state is written per message, not per bucket"


def _run_consumer(mongo_uri, db_name, *args):
    return subprocess.Popen([sys.executable, "-m", "tests.entrypoints.consumer_proc", mongo_uri, db_name, "events",
                             *args])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dedupe", [False, True])
async def test_sigkilled_consumer_loses_nothing(make_queue, sync_db, mongo_uri, db_name, dedupe):
    q = make_queue(bucket_max_size=200, dedupe=dedupe)
    total = 2000
    await q.push_many(({"i": i} for i in range(total)), ) if not dedupe else None
    if dedupe:
        await asyncio.gather(*(q.push({"i": i}, key=f"k{i}") for i in range(total)))
    flags = ["--dedupe"] if dedupe else []
    victim = _run_consumer(mongo_uri, db_name, "--die-after", "150", *flags)
    # the survivor starts once the victim serves, so that a slow start-up cannot leave the victim nothing to die over
    await eventually(lambda: sync_db.processed.find_one({"pid": victim.pid}) is not None or victim.poll() is not None,
                     what="the victim to serve a message")
    survivor = _run_consumer(mongo_uri, db_name, *flags)
    assert await asyncio.to_thread(victim.wait, 60) == -9
    late = _run_consumer(mongo_uri, db_name, *flags)  # claims what the victim held once its lease expires
    for proc in (survivor, late):
        assert await asyncio.to_thread(proc.wait, 90) == 0
    records = list(sync_db.processed.find())
    by_message = defaultdict(list)
    for r in records:
        by_message[r["i"]].append(r)
    assert sorted(by_message) == list(range(total)), "a message was never processed"
    duplicated = {i: rs for i, rs in by_message.items() if len(rs) > 1}
    for rs in duplicated.values():
        assert any(r["pid"] == victim.pid for r in rs), "a duplicate that no crash explains"
        spans = sorted((r["start"], r["end"]) for r in rs)
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), "processed by two consumers at once"
        assert max(r["tries"] for r in rs) >= 1
    if dedupe:
        assert not duplicated, f"{len(duplicated)} duplicates with dedupe on"
    else:
        assert 0 < len(duplicated) <= 150, "duplicates must be the victim's acked-but-unflushed messages"
    assert sync_db.events.count_documents({"fin": {"$exists": False}}) == 0


@pytest.mark.timeout(120)
async def test_the_housekeeping_lease_is_handed_over_when_its_holder_is_killed(make_queue, sync_db, mongo_uri, db_name):
    round_s = 0.5  # the processes' housekeeping rounds, under a lease of 2.5 s
    await make_queue().push({"i": 0})  # sets the queue up
    flags = ["--housekeeping-every", str(round_s), "--idle-timeout", "60"]

    def keeper() -> str:
        doc = sync_db["events.control"].find_one({"_id": "housekeeping"})
        return doc["owner"] if doc else ""

    holder = _run_consumer(mongo_uri, db_name, *flags)
    other = None
    try:
        await eventually(lambda: keeper().endswith(f":{holder.pid}"), timeout=60, what="a first holder")
        other = _run_consumer(mongo_uri, db_name, *flags)
        # the other's tries meanwhile fail: the holder renews its lease (two leases and a round: a holder that
        # stopped renewing would have lost it by then; four leases were 4.5 s more of waiting)
        await asyncio.sleep(2 * 5 * round_s + round_s)
        assert other.poll() is None and keeper().endswith(f":{holder.pid}")
        holder.kill()
        assert await asyncio.to_thread(holder.wait, 30) == -9
        # taken over once the lease ends, at the other's next try: within 2 leases and a round
        await eventually(lambda: keeper().endswith(f":{other.pid}"), timeout=2 * 5 * round_s + round_s + 10,
                         what="the hand-over to the surviving consumer")
    finally:
        for proc in (holder, other):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)


async def test_reserve_many_takes_what_is_due_up_to_n_across_buckets(make_queue):
    # a reserve_many used to stop at the end of the bucket it held while more buckets were due
    q = make_queue(bucket_max_wait=0.01, bucket_max_size=50, change_streams=False)
    await q.push_many(list(range(120)))
    first = await q.reserve_many(80, timeout=2)  # a bucket and a part of the next: n bounds it
    rest = await q.reserve_many(80, timeout=2)  # the rest of that one and the third
    assert (len(first), len(rest)) == (80, 40)
    assert sorted(m.payload for m in first + rest) == list(range(120))
    for message in first + rest:
        await message.ack()
    assert await q.reserve_many(5, timeout=0.1) == []
    with pytest.raises(bucketq.InvalidOption):
        await q.reserve_many(0)


async def test_reserve_many_returns_every_due_message_of_two_buckets_at_once(make_queue):
    q = make_queue(bucket_max_size=2, change_streams=False)
    await q.push_many(["1:0", "1:1", "2:0", "2:1"])
    assert (await q.stats())["buckets"] == 2
    batch = await q.reserve_many(100, timeout=1)
    assert sorted(m.payload for m in batch) == ["1:0", "1:1", "2:0", "2:1"]
    for message in batch:
        await message.ack()
    assert await q.reserve_many(100, timeout=0.1) == []


async def test_reserve_many_hands_over_what_it_holds_when_a_further_claim_fails(make_queue, memory_db):
    q = make_queue(target=memory_db, bucket_max_size=2, change_streams=False)
    await q.push_many(["1:0", "1:1", "2:0", "2:1"])
    first = await q.reserve(timeout=1)
    refused = memory_db.faults.refuse("findAndModify", collection="events", times=2,
                                      error=OperationFailure("not authorized", 13))
    batch = await q.reserve_many(100, timeout=1)  # its further claim (and the uncounted retry) refused
    assert refused.hits == 2 and [m.payload for m in [first, *batch]] == ["1:0", "1:1"]
    rest = await q.reserve_many(100, timeout=1)
    assert [m.payload for m in rest] == ["2:0", "2:1"]
    for message in [first, *batch, *rest]:
        await message.ack()


async def test_ack_many_acks_a_reserve_many_batch_in_one_call(make_queue, sync_db):
    q = make_queue(bucket_max_size=4, change_streams=False)
    await q.push_many(range(10))
    batch = await q.reserve_many(100, timeout=1)
    assert sorted(m.payload for m in batch) == list(range(10))
    await q.ack_many(batch[:5], wait=True)  # written when it returns: the first bucket finished, one slot of the next
    assert all(m.resolved for m in batch[:5]) and not any(m.resolved for m in batch[5:])
    assert (await q.stats())["in_flight"] == 5
    await q.ack_many(batch[5:])
    assert await q.reserve_many(100, timeout=0.1) == []
    await q.drain()
    assert sync_db.events.count_documents({"fin": {"$exists": False}}) == 0


async def test_ack_many_stops_at_the_first_message_it_cannot_ack(make_queue):
    q = make_queue(bucket_max_wait=0.01, change_streams=False)
    await q.push_many(["a", "b", "c"])
    a, b, c = await q.reserve_many(3, timeout=1)
    await b.ack()
    with pytest.raises(bucketq.AlreadyResolved):
        await q.ack_many([a, b, c])
    assert (a.resolved, c.resolved) == (True, False)  # as acking each in turn would leave them
    with pytest.raises(bucketq.InvalidOption):
        await q.ack_many([c, "c"])
    assert not c.resolved  # refused before any ack
    await q.ack_many([])
    other = make_queue(bucket_max_wait=0.01, change_streams=False)
    await other.push("d")
    d = await other.reserve(timeout=1)
    with pytest.raises(bucketq.InvalidOption):  # a message of another queue's consumer
        await q.ack_many([d])
    # Both are still served, and theirs to ack (unresolved, each close would wait drain_timeout for them).
    await q.ack_many([c])
    await other.ack_many([d])
    assert (c.resolved, d.resolved) == (True, True)


async def test_ack_many_stores_dedupe_keys_before_it_returns(make_queue):
    q = make_queue(bucket_max_wait=0.01, dedupe=True, change_streams=False)
    await q.push_many([bucketq.Outgoing({"n": 1}, key="order-1"), {"n": 2}])
    await q.ack_many(await q.reserve_many(2, timeout=1))
    await q.push({"n": 3}, key="order-1")  # the same order, sent again
    assert await q.reserve_many(2, timeout=0.3) == []

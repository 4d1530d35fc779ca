"""Operator controls over a real connection: pause and resume (across processes' queue objects, within the
stated bound), remove one pending message, purge a queue, list the queues of a database, and push_many with
per-message options."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from bson import ObjectId
from pymongo.errors import DuplicateKeyError

import bucketq
from bucketq.core import claims
from bucketq.shell.pause_gate import PAUSE_REFRESH_S
from tests.helpers import next_message, served, utc_now

UTC = dt.timezone.utc


# -- pause and resume -------------------------------------------------------------------------------------------

async def test_pause_reaches_other_consumers_within_the_refresh_bound_and_resume_restarts_them(make_queue, sync_db):
    operator = make_queue(bucket_max_wait=0.005)
    consumer = make_queue()  # another Queue: its own pause gate, as in another process
    await operator.push("warm-up")
    assert await served(consumer, want=1) == ["warm-up"]  # the consumer has read the pause state

    await operator.pause()
    paused_at = time.monotonic()
    assert await operator.reserve(timeout=0.2) is None  # the pausing process's own consumer: at once
    # past the bound (a refresh), with room for a loaded machine
    await asyncio.sleep(max(0.0, paused_at + PAUSE_REFRESH_S + 1.0 - time.monotonic()))
    message_id = await operator.push("while paused")  # pushes still work
    assert await consumer.reserve(timeout=1.0) is None  # past the bound: the consumer has stopped claiming
    assert (await operator.stats())["ready"] == 1
    doc = sync_db["events.control"].find_one({"_id": "pause"})
    assert doc["paused"] is True and doc["by"] == claims.owner_name() and isinstance(doc["at"], dt.datetime)
    assert await make_queue().paused() is True  # stored: any new queue object sees it

    await operator.resume()
    resumed_at = time.monotonic()
    message = await consumer.reserve(timeout=PAUSE_REFRESH_S + 20)
    assert message is not None and message.id == message_id
    # a refresh plus a poll (about 1.1 s); the bound leaves room for a loaded machine
    assert time.monotonic() - resumed_at < PAUSE_REFRESH_S + 5
    await message.ack(wait=True)
    assert await consumer.paused() is False


async def test_a_paused_consumer_serves_and_flushes_the_buckets_it_already_holds(make_queue):
    producer = make_queue(bucket_max_wait=0.005)
    consumer = make_queue(state_flush_period=0.05)
    await producer.push_many(["a", "b", "c"])  # one bucket
    first = await consumer.reserve(timeout=2)
    assert first is not None and first.payload == "a"
    await producer.pause()
    await consumer.paused()  # refresh its gate now rather than wait up to PAUSE_REFRESH_S
    await producer.push("not claimed while paused")
    rest = [await consumer.reserve(timeout=1) for _ in range(2)]
    assert [m.payload for m in rest] == ["b", "c"]  # held: still served
    assert await consumer.reserve(timeout=0.5) is None  # the new bucket is not claimed
    for message in (first, *rest):
        await message.ack(wait=True)  # and flushed: the held bucket is finished
    row = await producer.stats()
    assert (row["ready"], row["in_flight"], row["buckets"]) == (1, 0, 1)
    await producer.resume()
    assert await served(consumer, want=1) == ["not claimed while paused"]


async def test_pause_and_resume_of_a_queue_that_was_never_written(make_queue, sync_db):
    q = make_queue()
    assert await q.paused() is False
    assert "events.control" not in sync_db.list_collection_names()  # reading made nothing
    await q.resume()  # not paused: a no-op that leaves it running
    assert await q.paused() is False
    await q.pause()
    await q.pause()
    assert await q.paused() is True


# -- remove -----------------------------------------------------------------------------------------------------

async def test_remove_marks_a_pending_message_done_so_no_consumer_delivers_it(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.005)
    ids = await q.push_many(["keep 1", "remove me", "keep 2"])
    assert await q.remove(ids[1]) is True
    assert await q.remove(ids[1]) is False  # already done
    assert (await q.stats())["ready"] == 2
    assert sync_db["events"].find_one()["done"] == [1]
    assert await served(make_queue(), want=2) == ["keep 1", "keep 2"]


async def test_remove_finds_a_nacked_message_in_its_retry_bucket(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.005)
    message_id = await q.push("retried")
    message = await q.reserve(timeout=2)
    await message.nack(60, error="later", wait=True)  # now in a retry bucket, under its original id (o)
    await q.drain()
    assert sync_db["events"].count_documents({"o": message_id}) == 1
    assert (await make_queue().stats())["scheduled"] == 1
    assert await make_queue().remove(message_id) is True
    assert (await make_queue().stats())["scheduled"] == 0


async def test_remove_refuses_a_message_whose_bucket_a_consumer_holds(make_queue):
    producer = make_queue(bucket_max_wait=0.005)
    consumer = make_queue()
    ids = await producer.push_many(["served", "held"])
    served = await consumer.reserve(timeout=2)
    assert served is not None
    with pytest.raises(bucketq.MessageHeld, match=f"{claims.owner_name()} holds until") as caught:
        await producer.remove(ids[1])
    assert ids[1] in str(caught.value)
    held = await consumer.reserve(timeout=1)  # nothing was removed: the holder serves it
    assert held is not None and held.id == ids[1]
    await consumer.ack_many([served, held])  # else the close waits drain_timeout (10 s) for them


async def test_remove_takes_a_bucket_back_from_a_claim_whose_lease_expired(make_queue, sync_db):
    q = make_queue()
    await q.push("set up")  # indexes and collections
    await served(q)
    past = utc_now() - dt.timedelta(seconds=30)
    bucket_id = ObjectId()
    sync_db["events"].insert_one({"_id": bucket_id, "v": 1, "enc": "json", "created": past, "due": past, "n": 2,
                                  "p": ['"keep"', '"drop"'], "done": [], "c": 1,
                                  "lease": {"token": "crashed", "owner": "gone:1", "until": past}})
    assert await q.remove(f"{bucket_id}:1") is True
    doc = sync_db["events"].find_one({"_id": bucket_id})
    assert doc["done"] == [1] and doc["lease"] is None
    # The crashed claimant's token no longer matches: its late writes (a retry copy of "drop") are refused.
    fence = claims.fenced({"_id": bucket_id}, "crashed")
    assert sync_db["events"].update_one(fence, {"$set": {"x": 1}}).matched_count == 0
    assert await served(make_queue(), want=1) == ["keep"]


class _ClaimedAfterRead:
    """The bucket collection, except that right after ``find`` has read, ``claim`` runs: a consumer claiming the
    bucket between the operator's read and its write."""

    def __init__(self, collection: Any, claim: Any) -> None:
        self._collection = collection
        self._claim = claim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collection, name)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        cursor = self._collection.find(*args, **kwargs)
        claim = self._claim

        class Cursor:
            async def to_list(self, length: int | None) -> list[dict]:
                docs = await cursor.to_list(length)
                await claim()
                return docs
        return Cursor()


async def test_remove_does_not_write_into_a_bucket_claimed_after_it_was_read(make_queue):
    producer = make_queue(bucket_max_wait=0.005)
    consumer = make_queue()
    [message_id] = await producer.push_many(["contested"])
    claimed: list[bucketq.Message | None] = []

    async def claim() -> None:
        if not claimed:
            claimed.append(await consumer.reserve(timeout=2))

    producer._store.buckets = _ClaimedAfterRead(producer._store.buckets, claim)
    with pytest.raises(bucketq.MessageHeld):
        await producer.remove(message_id)
    assert claimed[0] is not None and claimed[0].id == message_id  # the consumer got it and may ack it
    await claimed[0].ack(wait=True)


@pytest.mark.parametrize("bad", [None, 42, "", "\ud800", b"6b0340a5e418eb7f18364742:0"])
async def test_remove_refuses_bad_ids(make_queue, bad):
    with pytest.raises(bucketq.InvalidOption, match="message_id"):
        await make_queue().remove(bad)


async def test_remove_of_an_unknown_id_is_false(make_queue):
    q = make_queue(bucket_max_wait=0.005)
    await q.push("x")
    assert await q.remove("no-such-id") is False
    assert await q.remove(f"{ObjectId()}:0") is False
    assert await q.remove(f"{ObjectId()}:70000") is False  # beyond any slot: not even looked up by _id


# -- purge ------------------------------------------------------------------------------------------------------

async def test_purge_ends_every_bucket_with_a_count_and_keeps_dead_letters(make_queue, sync_db):
    producer = make_queue(bucket_max_wait=0.005, max_attempts=1)
    consumer = make_queue(max_attempts=1)
    await producer.push_many(["dies"])
    doomed = await consumer.reserve(timeout=2)
    await doomed.nack(error="dead on purpose", wait=True)  # one dead letter, kept by purge
    await producer.push_many(["held", "h2", "h3", "h4"])
    held = await consumer.reserve(timeout=2)
    await held.ack(wait=True)  # 3 unfinished left in the held bucket
    # Two buckets claimed in a row make a backlog, so serving the held one sent a claim ahead: once it has found
    # nothing, the ready bucket stays ready (on a loaded machine its request went out after that bucket was written,
    # and took it: in_flight 8, ready 0)
    await consumer._consumer._claiming.ahead_landed()
    await producer.push_many([f"ready {i}" for i in range(5)])
    await producer.push_many([bucketq.Outgoing(f"later {i}", delay=60) for i in range(3)])
    row = await producer.stats()
    assert (row["ready"], row["scheduled"], row["in_flight"], row["dead"]) == (5, 3, 3, 1)
    bucket_ids = [d["_id"] for d in sync_db["events"].find({"fin": {"$exists": False}})]

    assert await producer.purge() == 11
    row = await producer.stats()
    assert (row["ready"], row["scheduled"], row["in_flight"], row["buckets"], row["dead"]) == (0, 0, 0, 0, 1)
    for doc in sync_db["events"].find({"_id": {"$in": bucket_ids}}):  # tombstones, as finished buckets leave
        assert set(doc) == {"_id", "pt", "v", "due", "lease", "fin"} and doc["lease"] is None
    with pytest.raises(DuplicateKeyError):  # so a producer's late insert retry stores nothing again
        sync_db["events"].insert_one({"_id": bucket_ids[0], "v": 1})
    with pytest.raises(bucketq.LeaseLost):  # the consumer's hold on its bucket ended
        await (await consumer.reserve(timeout=1)).ack(wait=True)
    assert await consumer.reserve(timeout=0.5) is None
    assert await producer.purge() == 0


# -- list_queues ------------------------------------------------------------------------------------------------

async def test_list_queues_by_uri_client_or_database_reads_only(make_queue, sync_db, mongo_uri, db_name, adb,
                                                                async_client):
    for name in ("beta", "alpha"):
        await make_queue(name=name).push(name)
    sync_db["users"].insert_one({"name": "ann"})  # an application's collection: not a queue
    before = sorted(sync_db.list_collection_names())
    assert await bucketq.list_queues(mongo_uri, db=db_name) == ["alpha", "beta"]
    assert await bucketq.list_queues(adb) == ["alpha", "beta"]
    assert await bucketq.list_queues(async_client, db=db_name) == ["alpha", "beta"]
    assert await bucketq.list_queues(mongo_uri, db=f"{db_name}_none") == []
    assert sorted(sync_db.list_collection_names()) == before
    with pytest.raises(bucketq.InvalidOption, match="needs a MongoDB URI"):
        await bucketq.list_queues(42)


# -- push_many with per-message options ---------------------------------------------------------------------------

async def test_push_many_takes_keys_delays_and_headers_per_message(make_queue):
    q = make_queue(bucket_max_wait=0.005, dedupe=True)
    at = utc_now() + dt.timedelta(hours=1)
    ids = await q.push_many([
        bucketq.Outgoing({"n": 1}, key="order-1", headers={"trace": "a"}),
        {"n": 2},  # a plain payload takes the call's headers
        bucketq.Outgoing({"n": 3}, delay=60),
        bucketq.Outgoing({"n": 4}, at=at, key="order-4"),
        bucketq.Outgoing({"n": 5}),
    ], headers={"source": "batch"})
    assert len(set(ids)) == 5
    row = await q.stats()
    assert (row["ready"], row["scheduled"]) == (3, 2)
    got = {}
    for _ in range(3):  # the two delayed ones are not due
        message = await next_message(q)
        got[message.payload["n"]] = (message.key, message.headers)
        await message.ack(wait=True)
    assert got == {1: ("order-1", {"trace": "a"}), 2: (None, {"source": "batch"}), 5: (None, {"source": "batch"})}
    await q.push_many([bucketq.Outgoing({"n": 6}, key="order-1")])  # dedupe by the per-message key
    assert await q.reserve(timeout=0.5) is None


@pytest.mark.parametrize("item, error, fragment", [
    (bucketq.Outgoing("x", key=5), bucketq.InvalidOption, "payload 1: key must be a string"),
    (bucketq.Outgoing("x", delay=-1), bucketq.InvalidOption, "payload 1: delay must be"),
    (bucketq.Outgoing("x", delay=1, at=utc_now()), bucketq.InvalidOption, "payload 1: give delay or at"),
    (bucketq.Outgoing("x", at=dt.datetime(2030, 1, 1)), bucketq.InvalidOption, "payload 1: at must be"),
    (bucketq.Outgoing("x", headers=["not", "a", "mapping"]), bucketq.InvalidOption, "payload 1: headers must be"),
    (bucketq.Outgoing({1, 2}), bucketq.EncodeError, "payload 1: cannot encode set"),
])
async def test_push_many_refuses_a_bad_item_before_pushing_any(make_queue, item, error, fragment):
    q = make_queue(bucket_max_wait=0.005)
    with pytest.raises(error, match=fragment):
        await q.push_many([bucketq.Outgoing("fine", key="k"), item, "also fine"])
    await q.flush()
    assert (await q.stats())["buckets"] == 0


async def test_an_outgoing_is_not_a_payload(make_queue):
    with pytest.raises(bucketq.EncodeError, match="Outgoing"):
        await make_queue().push(bucketq.Outgoing({"n": 1}, key="k"))


@pytest.mark.backends("memory", "server")
@pytest.mark.parametrize("lands", ["after the purge", "between the purge's mark and its tombstones"])
async def test_a_purge_while_a_nack_writes_its_retry_copy_leaves_nothing_to_deliver(make_queue, sync_db,
                                                                                    monkeypatch, lands):
    """The nack's fenced lease extension is applied, then its retry copy's insert is held back while an operator
    (another process) purges the queue; the copy lands after the purge, or while it runs. The purged message is
    counted once and not delivered again."""
    options = {"bucket_max_wait": 0.005, "poll_interval": 0.02, "change_streams": False}
    q, operator = make_queue(**options), make_queue(**options)
    await q.push("purged")
    message = await q.reserve(timeout=2)
    on_its_way, landing, landed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def hold(store: Any, before: Callable[[], Awaitable[None]]) -> None:
        insert_copies = store.insert_copies

        async def held_back(collection: Any, docs: list[dict]) -> None:
            if collection is store.buckets:
                await before()
            await insert_copies(collection, docs)
            landed.set()

        monkeypatch.setattr(store, "insert_copies", held_back)

    async def copy_waits() -> None:  # the retry copy, sent after the fenced extension
        on_its_way.set()
        await landing.wait()

    async def copy_lands() -> None:  # the purge's first insert: the tombstones of the copies
        landing.set()
        await landed.wait()

    hold(q._store, copy_waits)
    if lands != "after the purge":
        hold(operator._store, copy_lands)
    nack = asyncio.ensure_future(message.nack(delay=0, wait=True))
    await asyncio.wait_for(on_its_way.wait(), 5)
    assert await operator.purge() == 1
    landing.set()
    with pytest.raises(bucketq.LeaseLost):
        await nack
    assert await served(q) == [], "the purged message was delivered again from its retry copy"
    assert sync_db["events"].count_documents({"fin": {"$exists": False}}) == 0

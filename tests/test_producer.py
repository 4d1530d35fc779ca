"""The write path over a real connection: bucketing, group commit (instant when idle, buckets filling while
writes are in flight, ``bucket_max_wait`` as the bound), retries without loss or duplicates, errors,
backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import bson
import pytest
from pymongo import AsyncMongoClient

import bucketq
from tests.helpers import StartedCommands, drained, eventually, lossy_queue
from tests.proxy import TcpProxy

pytestmark = pytest.mark.backends("memory", "server")


@pytest.mark.slow
async def test_100k_pushes_become_ceil_n_over_1024_buckets(make_queue, sync_db):
    q = make_queue()
    ids = await q.push_many({"i": i} for i in range(100_000))
    assert len(set(ids)) == 100_000
    docs = list(sync_db.events.find({}, {"n": 1, "p": 1}))
    assert len(docs) == math.ceil(100_000 / 1024) == 98
    assert sum(d["n"] for d in docs) == 100_000
    assert max(d["n"] for d in docs) == 1024
    stored = sorted(int(p.split(":")[1].rstrip("}")) for d in docs for p in d["p"])
    assert stored == list(range(100_000))


async def test_lone_awaited_push_on_an_idle_queue_takes_a_round_trip_not_bucket_max_wait(make_queue, sync_db):
    """How fast (p50, p99) is the bench's latency goal; here, that sequential awaited pushes do not linger: with
    bucket_max_wait at 30 s, a push that waited for it would take 30 s, any machine writes one in far less."""
    q = make_queue(bucket_max_wait=30)
    await q.push({"warm": True})  # the first push also syncs the clock and creates the indexes
    ids = []
    for i in range(10):
        started = time.monotonic()
        ids.append(await q.push({"i": i}))
        took = time.monotonic() - started
        assert took < 15, f"took {took:.1f} s: the push lingered for bucket_max_wait"
        assert sync_db.events.count_documents({"_id": bson.ObjectId(ids[-1].split(":")[0])}) == 1
    assert len(set(ids)) == 10 and sync_db.events.count_documents({}) == 11


async def _concurrent_pushes_make_few_buckets(q: bucketq.Queue, sync_db, before: int) -> None:
    ids = await asyncio.gather(*(q.push({"i": i}) for i in range(20_000)))
    assert len(set(ids)) == 20_000
    buckets = sync_db.events.count_documents({}) - before
    assert buckets <= math.ceil(20_000 / 1024) + 3, f"{buckets} buckets for 20,000 concurrent pushes"


@pytest.mark.slow
async def test_concurrent_pushes_still_fill_buckets(make_queue, sync_db):
    q = make_queue()
    await q.push("warm")
    await _concurrent_pushes_make_few_buckets(q, sync_db, before=1)


@pytest.mark.slow
async def test_concurrent_first_pushes_on_a_cold_queue_still_fill_buckets(make_queue, sync_db):
    await _concurrent_pushes_make_few_buckets(make_queue(), sync_db, before=0)


@contextlib.asynccontextmanager
async def _warm_queue_via_proxy(mongo_uri: str, db_name: str, **options: Any) -> AsyncIterator[tuple]:
    """A queue whose connection goes through a proxy, set up (clock, indexes) by a first push."""
    with TcpProxy.to(mongo_uri) as proxy:
        client = AsyncMongoClient(proxy.uri, tz_aware=True)
        q = bucketq.Queue(client, name="events", db=db_name, **options)
        try:
            await q.push("warm")
            yield proxy, q
        finally:
            proxy.disarm()
            await q.close()
            await client.close()


async def _push_held_back(proxy: TcpProxy, q: bucketq.Queue, seconds: float) -> asyncio.Future:
    """Push one message and return once its bucket's insert is on its way and held back ``seconds``."""
    slow = proxy.delay("insert", seconds=seconds, collection="events")
    first = asyncio.ensure_future(q.push("first"))
    while not slow.hits:
        await asyncio.sleep(0.005)
    return first


async def test_pushes_made_while_a_write_is_in_flight_wait_for_it_and_share_a_bucket(mongo_uri, db_name):
    async with _warm_queue_via_proxy(mongo_uri, db_name, bucket_max_wait=30) as (proxy, q):
        started = time.monotonic()
        first = await _push_held_back(proxy, q, 0.5)
        later = []
        for i in range(3):  # each in a turn of the loop of its own: no burst, only the write in flight
            later.append(asyncio.ensure_future(q.push(i)))
            await asyncio.sleep(0.01)
        assert not first.done()
        first_id, *later_ids = await asyncio.gather(first, *later)
        took = time.monotonic() - started
    assert len({i.split(":")[0] for i in later_ids}) == 1, "pushes made during a write did not share a bucket"
    assert first_id.split(":")[0] != later_ids[0].split(":")[0]
    assert took < 5, f"took {took:.1f}s: the later pushes waited for bucket_max_wait (30 s), not for the write"


async def test_bucket_max_wait_bounds_the_wait_behind_a_slow_write(mongo_uri, db_name):
    async with _warm_queue_via_proxy(mongo_uri, db_name, bucket_max_wait=0.1) as (proxy, q):
        first = await _push_held_back(proxy, q, 2.0)
        started = time.monotonic()
        await q.push("second")  # sealed after bucket_max_wait, written beside the held-back write
        took = time.monotonic() - started
        assert not first.done(), "the second push waited for the held-back write (or it was not held back)"
        await first
    assert took >= 0.1 - 0.01, f"took {took:.2f}s: sealed before bucket_max_wait (0.1 s)"


async def test_each_waiter_of_a_failed_bucket_gets_a_failure_of_its_own(mongo_uri, db_name):
    async with _warm_queue_via_proxy(mongo_uri, db_name, write_timeout=0.5) as (proxy, q):
        proxy.lose_request("insert", times=1000, collection="events")  # every attempt is refused
        futures = [q.push_nowait(i) for i in range(3)]
        many = asyncio.ensure_future(q.push_many(["a", "b"]))
        failures = []
        for future in [*futures, many]:
            with pytest.raises(bucketq.WriteFailed) as caught:
                await future
            failures.append(caught.value)
    assert len({id(f) for f in failures}) == 4, "waiters share a failure object"
    assert all(f.__cause__ is not None for f in failures)


async def test_push_resolves_only_after_the_write(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.1)
    message_id = await q.push({"x": 1})
    bucket_id = message_id.split(":")[0]
    assert sync_db.events.count_documents({}) == 1
    assert str(sync_db.events.find_one()["_id"]) == bucket_id


async def test_full_bucket_is_written_at_once(make_queue, sync_db):
    q = make_queue(bucket_max_size=10, bucket_max_wait=30)
    started = time.monotonic()
    await q.push_many(range(10))
    assert time.monotonic() - started < 5
    assert sync_db.events.count_documents({}) == 1


@pytest.mark.backends("server")
@pytest.mark.parametrize(("writers", "inserts_of"), [(1, [4]), (2, [2, 2]), (4, [1, 1, 1, 1])])
@pytest.mark.parametrize("push", ["push_many", "push_nowait"])
async def test_the_buckets_one_burst_of_pushes_fills_are_shared_out_among_the_writers(mongo_uri, db_name, sync_db,
                                                                                      push, writers, inserts_of):
    """Each command costs the client a few hundred microseconds in the async driver: the buckets a
    burst fills (a ``push_many``, or ``push_nowait``s with no await between them) go out together, shared evenly
    among the free writers (``max_in_flight_writes``), not an insert as each one fills."""
    commands = StartedCommands()
    client = AsyncMongoClient(mongo_uri, event_listeners=[commands], tz_aware=True)
    q = bucketq.Queue(client, name="events", db=db_name, bucket_max_size=100, bucket_max_wait=30,
                      max_in_flight_writes=writers)
    try:
        await q.push("warm")  # sets the queue up, and fills no bucket of the burst
        await q.flush()
        commands.events.clear()
        if push == "push_many":
            ids = await q.push_many(range(400))
        else:
            ids = await asyncio.gather(*[q.push_nowait(i) for i in range(400)])
        assert len(set(ids)) == 400
        sizes = [len(insert["documents"]) for insert in commands.named("insert")]  # an insert's OP_MSG payload
        assert sizes == inserts_of, f"buckets an insert: {sizes}"
        assert sync_db.events.count_documents({}) == 5
    finally:
        await q.close()
        await client.close()


async def test_push_many_gives_each_message_the_id_of_its_own_slot(make_queue, sync_db):
    """Messages due now share one waiter a bucket (a run): each id must still name the slot holding its message,
    across full buckets, with delayed and grouped items in between, and beside other calls that wait for room."""
    q = make_queue(bucket_max_size=7, bucket_max_wait=30, bucket_max_bytes=64 * 1024, max_buffered_bytes=64 * 1024)
    items: list = []
    for i in range(60):
        items.append(bucketq.Outgoing(i, delay=3600) if i % 9 == 4 else bucketq.Outgoing(i, group="g")
                     if i % 11 == 5 else i)
    # Two calls of more than max_buffered_bytes each: both wait for room.
    big = [[f"{k}{i}" + "x" * 3000 for i in range(40)] for k in "ab"]
    ids, other, a_ids, b_ids = await asyncio.gather(q.push_many(items), q.push("other"), q.push_many(big[0]),
                                                    q.push_many(big[1]))
    payloads = {str(d["_id"]): d["p"] for d in sync_db.events.find()}

    def stored(message_id: str) -> object:
        bucket, slot = message_id.rsplit(":", 1)
        return json.loads(payloads[bucket][int(slot)])

    assert [stored(i) for i in ids] == list(range(60))
    assert [stored(i) for i in a_ids] == big[0] and [stored(i) for i in b_ids] == big[1]
    assert stored(other) == "other"
    assert len(set(ids + a_ids + b_ids + [other])) == 141


async def test_a_push_many_whose_insert_lost_its_reply_stores_each_message_once(backend, make_queue, request,
                                                                                 monkeypatch, sync_db):
    """A ``push_many`` of plain payloads (its passes over the whole list, ``Producer._plain_slots``) whose bucket
    insert is applied but its reply lost: the retry stores nothing twice, and every id names its own message."""
    q, lose_reply = lossy_queue(backend, make_queue, request, bucket_max_size=100, bucket_max_wait=30)
    await q.stats()  # set up first: the fault is for a bucket's insert
    lost = lose_reply("insert", "events")
    passes = []
    plain_slots = q._producer._plain_slots
    monkeypatch.setattr(q._producer, "_plain_slots", lambda items: passes.append(plain_slots(items)) or passes[-1])
    payloads = [{"i": i, "pad": "x" * 50} for i in range(250)]
    ids = await q.push_many(payloads)
    assert lost.hits == 1
    assert len(passes) == 1 and passes[0] is not None, "the call did not take the passes"
    stored = {str(d["_id"]): d["p"] for d in sync_db.events.find()}
    assert sum(map(len, stored.values())) == 250, "a message was stored twice, or not at all"
    by_id = {i: json.loads(stored[i.rsplit(":", 1)[0]][int(i.rsplit(":", 1)[1])]) for i in ids}
    assert list(by_id.values()) == payloads and len(by_id) == 250
    assert {m.id: m.payload for m in await drained(q, want=len(by_id))} == by_id


async def test_buckets_split_by_bytes_below_the_limit(make_queue, sync_db):
    q = make_queue(bucket_max_bytes=64 * 1024, max_buffered_bytes=1024 * 1024)
    await q.push_many("x" * 1000 for _ in range(300))
    docs = list(sync_db.events.find())
    assert sum(d["n"] for d in docs) == 300
    sizes = [len(bson.encode(d)) for d in docs]
    assert len(docs) >= 5 and max(sizes) <= 64 * 1024


@pytest.mark.timeout(120)
async def test_connection_cuts_mid_run_lose_and_duplicate_nothing(mongo_uri, db_name, sync_db):
    with TcpProxy.to(mongo_uri) as proxy:
        client = AsyncMongoClient(proxy.uri, serverSelectionTimeoutMS=5000, tz_aware=True)
        q = bucketq.Queue(client, name="events", db=db_name, bucket_max_size=100, bucket_max_wait=0.05)
        total = 20_000

        async def cutter() -> None:
            for _ in range(8):
                await asyncio.sleep(0.15)
                proxy.cut()

        try:
            pushes = asyncio.gather(*(q.push({"i": i}) for i in range(total)))
            _, ids = await asyncio.gather(cutter(), pushes)
        finally:
            await q.close()
            await client.close()
    assert proxy.cuts >= 8
    assert len(set(ids)) == total
    docs = list(sync_db.events.find({}, {"p": 1}))
    values = sorted(int(p.split(":")[1].rstrip("}")) for d in docs for p in d["p"])
    assert values == list(range(total)), "a message was lost or stored twice"


async def test_write_that_keeps_failing_fails_its_pushes(db_name, closed_port):
    # Nothing listens on this port: every write fails, and the pushes must say so rather than succeed.
    client = AsyncMongoClient(f"mongodb://127.0.0.1:{closed_port}/", serverSelectionTimeoutMS=100,
                              connectTimeoutMS=100)
    q = bucketq.Queue(client, name="events", db=db_name, bucket_max_wait=0.01, write_timeout=0.3)
    q._clock._synced_at = time.monotonic()  # skip the clock sync, which would fail first with the same error
    q._life.setup.indexed = True
    with pytest.raises(bucketq.WriteFailed):
        await q.push({"x": 1})
    await client.close()


async def test_unencodable_payload_fails_alone(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.05)
    good = [q.push_nowait({"i": i}) for i in range(3)]
    with pytest.raises(bucketq.EncodeError, match="cannot encode object payload"):
        q.push_nowait(object())
    with pytest.raises(bucketq.EncodeError, match="not valid JSON"):
        await q.push({"x": float("nan")})
    assert len(await asyncio.gather(*good)) == 3
    assert sync_db.events.find_one()["n"] == 3


async def test_push_many_rejects_before_pushing_anything(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.05)
    with pytest.raises(bucketq.EncodeError, match="payload 2"):
        await q.push_many([1, 2, {1, 2}])
    await q.flush()
    assert sync_db.events.count_documents({}) == 0


async def test_payload_too_large_for_any_bucket(make_queue):
    q = make_queue(bucket_max_bytes=4096, max_buffered_bytes=65536)
    with pytest.raises(bucketq.PayloadTooLarge, match="bucket_max_bytes"):
        await q.push("x" * 5000)
    # counted in UTF-8 bytes, not characters: 2,000 characters that take 4,000 bytes
    for push in (q.push_nowait, q.push):
        with pytest.raises(bucketq.PayloadTooLarge, match="bucket_max_bytes"):
            await push("\u00e9" * 2000)


@pytest.mark.parametrize("codec, payload", [("json", {"a": 1}), ("json", {"name": "Zo\u00eb"}),
                                            ("msgpack", {"b": b"\xff"}), ("bson", {"a": 1})])
async def test_each_push_encodes_its_payload_once(make_queue, monkeypatch, codec, payload):
    """Whichever way a push goes (the common path, or the general one for a codec that stores documents), its
    payload is encoded once."""
    q = make_queue(bucket_max_wait=0.01, codec=codec)
    encoded = []
    dump = q.codec.dump
    monkeypatch.setattr(q.codec, "dump", lambda value: encoded.append(value) or dump(value))
    await q.push(payload)
    await q.push_nowait(payload)
    await q.push_many([payload])
    assert encoded == [payload] * 3


@pytest.mark.parametrize("codec, payload", [("json", {"name": "Zo\u00eb", "city": "\u6771\u4eac" * 50}),
                                            ("msgpack", {"b": b"\xff" * 10})])
async def test_non_ascii_and_binary_payloads_fill_buckets_within_max_bytes(make_queue, sync_db, codec, payload):
    """Text that is not ASCII and binary payloads take the producer's common path too, one by one and in a
    ``push_many`` (among ASCII ones): their slots are counted in the bytes that BSON stores, so no bucket goes over
    ``bucket_max_bytes``."""
    q = make_queue(bucket_max_bytes=4096, max_buffered_bytes=1024 * 1024, codec=codec)
    await asyncio.gather(*(q.push_nowait(payload) for _ in range(300)))
    await q.push_many([payload, {"a": 1}] * 150)
    docs = list(sync_db.events.find())
    assert sum(d["n"] for d in docs) == 600
    assert max(len(bson.encode(d)) for d in docs) <= 4096
    message = await q.reserve(timeout=2)
    assert message is not None and message.payload == payload
    await message.ack()  # else the close waits drain_timeout (10 s) for it


async def test_push_after_drain_or_close_is_refused(make_queue):
    q = make_queue()
    await q.push(1)
    await q.drain()
    with pytest.raises(bucketq.QueueClosed):
        await q.push(2)
    await q.close()
    with pytest.raises(bucketq.QueueClosed):
        q.push_nowait(3)


@pytest.mark.parametrize("options, message", [
    ({"bucket_max_size": 0}, "bucket_max_size"),
    ({"bucket_max_size": True}, "bucket_max_size"),
    ({"bucket_max_bytes": 17 * 1024 * 1024}, "bucket_max_bytes"),
    ({"bucket_max_wait": -1}, "bucket_max_wait"),
    ({"max_buffered_bytes": 10}, "max_buffered_bytes"),
    ({"lease": 3, "state_flush_period": 2}, "state_flush_period"),
    ({"finish_linger": -0.1}, "finish_linger"),
    ({"finish_linger": "1"}, "finish_linger"),
    ({"malformed": "drop"}, "malformed"),
    ({"colour": "blue"}, "unknown option"),
    ({"codec": "xml"}, "unknown codec"),
    ({"name": ""}, "name"),
    ({"name": "a$b"}, "not a valid queue name"),
])
def test_invalid_options_fail_at_construction(queue_target, options, message):
    kwargs = {"name": "events", **options}
    with pytest.raises(bucketq.InvalidOption, match=message):
        bucketq.Queue(queue_target, **kwargs)


def test_bad_target_fails_at_construction():
    with pytest.raises(bucketq.InvalidOption, match="invalid MongoDB URI"):
        bucketq.Queue("http://nowhere", name="events")
    with pytest.raises(bucketq.InvalidOption, match="needs a MongoDB URI"):
        bucketq.Queue(42, name="events")


@pytest.mark.parametrize("kwargs, message", [
    ({"delay": -1}, "delay"),
    ({"delay": 1, "at": None}, None),
    ({"headers": ["not", "a", "mapping"]}, "headers"),
    ({"key": 5}, "key"),
])
async def test_bad_push_arguments(make_queue, kwargs, message):
    q = make_queue(bucket_max_wait=0.01)
    if message is None:
        assert await q.push(1, **kwargs)
        return
    with pytest.raises(bucketq.InvalidOption, match=message):
        await q.push(1, **kwargs)


async def test_memory_stays_bounded_under_a_producer_faster_than_the_server(mongo_uri, db_name, sync_db):
    limit = 256 * 1024
    with TcpProxy.to(mongo_uri, delay_s=0.02) as proxy:  # every chunk waits 20 ms: a slow server
        client = AsyncMongoClient(proxy.uri, tz_aware=True)
        q = bucketq.Queue(client, name="events", db=db_name, bucket_max_bytes=32 * 1024, max_buffered_bytes=limit,
                          bucket_max_wait=0.05)
        peak = 0
        payload = "y" * 500
        futures = []
        for _ in range(3000):
            futures.append(asyncio.ensure_future(q.push(payload)))
            await asyncio.sleep(0)
            peak = max(peak, q._producer.buffered_bytes)
        with pytest.raises(bucketq.BufferFull):
            while True:  # push_nowait does not wait: it says the buffer is full
                q.push_nowait(payload)
                peak = max(peak, q._producer.buffered_bytes)
        await asyncio.gather(*futures)
        await q.close()
        await client.close()
    assert peak <= limit, f"buffered {peak} bytes, more than max_buffered_bytes={limit}"
    assert sync_db.events.aggregate([{"$group": {"_id": None, "n": {"$sum": "$n"}}}]).next()["n"] >= 3000


async def test_delayed_messages_do_not_hold_back_others(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.05, due_granularity=1.0)
    now_id = q.push_nowait({"when": "now"})
    later_id = q.push_nowait({"when": "later"}, delay=30)
    await asyncio.gather(now_id, later_id)
    buckets = list(sync_db.events.find({}, {"due": 1, "n": 1, "created": 1}))
    assert len(buckets) == 2, "a message due now shared a bucket with one due in 30 s"
    message = await q.reserve(timeout=2)
    assert message is not None and message.payload == {"when": "now"}
    await message.ack()
    assert await q.reserve(timeout=0.2) is None


async def test_delayed_bucket_is_due_within_one_granularity_of_each_message(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.05, due_granularity=2.0)
    before = q._clock.now()
    delays = [5.0, 5.5, 6.3, 6.9, 9.0]
    await asyncio.gather(*(q.push({"d": d}, delay=d) for d in delays))
    for doc in sync_db.events.find():
        for payload in doc["p"]:
            own_due = before.timestamp() + float(payload.split(":")[1].rstrip("}"))
            lateness = doc["due"].replace(tzinfo=before.tzinfo).timestamp() - own_due
            assert -0.5 <= lateness <= 2.0 + 0.5, f"message due {lateness:.2f}s after its own due time"


async def test_write_concern_is_applied(make_queue):
    q = make_queue(write_concern=1)
    assert q._store.buckets.write_concern.document == {"w": 1}
    assert await q.push(1)


async def test_motor_database_works_through_the_adapter(mongo_uri, db_name, sync_db):
    motor_asyncio = pytest.importorskip("motor.motor_asyncio")
    client = motor_asyncio.AsyncIOMotorClient(mongo_uri)
    q = bucketq.Queue(client[db_name], name="events", bucket_max_wait=0.05, change_streams=True)
    await q.push_many([{"i": i} for i in range(5)])
    assert (await q.stats())["ready"] == 5
    got = []
    while (message := await q.reserve(timeout=1)) is not None:
        got.append(message.payload["i"])
        await message.ack()
        if len(got) == 5:
            break
    assert got == [0, 1, 2, 3, 4]
    for _ in range(100):  # Motor opens the stream on a worker thread: give it a moment
        if q._wakeup.streaming:
            break
        await asyncio.sleep(0.02)
    assert q._wakeup.streaming, "the change stream did not start through the Motor adapter"
    await q.close()
    await eventually(lambda: sync_db.events.count_documents({"fin": {"$exists": False}}) == 0,
                     what="every bucket finished")
    client.close()


@pytest.mark.needs("replica_set")
async def test_majority_write_concern_on_a_replica_set(make_queue, sync_db):
    q = make_queue(write_concern="majority", bucket_max_wait=0.01)
    assert q._store.buckets.write_concern.document == {"w": "majority"}
    await q.push_many(range(10))
    assert sync_db.events.find_one()["n"] == 10


def test_feature_probe_does_not_credit_the_test_server_with_what_it_ignores(mongo_uri, features):
    from pymongo import MongoClient

    with MongoClient(mongo_uri) as client:
        real_mongod = "gitVersion" in client.admin.command("buildInfo")
    if not real_mongod:
        assert not {"ttl", "partial_indexes", "transactions"} & features


async def test_bucket_min_wait_makes_fuller_buckets_under_a_steady_trickle(make_queue, sync_db):
    """Group commit writes each push of a slow trickle alone; ``bucket_min_wait`` lets them share buckets."""
    buckets = {}
    # A push every 20 ms for 0.4 s: bucket_min_wait 0.5 s is past the whole trickle (even slowed down several
    # times on a loaded machine), and each write of the eager queue ends long before the next push.
    for name, min_wait in (("eager", 0.0), ("patient", 0.5)):
        q = make_queue(name=name, bucket_min_wait=min_wait)
        await q.push("warm")
        pushes = []
        for i in range(20):
            pushes.append(q.push_nowait(i))
            await asyncio.sleep(0.02)
        await asyncio.gather(*pushes)
        buckets[name] = sync_db[name].count_documents({}) - 1
    assert buckets["patient"] <= 5 and buckets["eager"] >= 2 * buckets["patient"], buckets

"""The in-memory database (``bucketq.memory``): MongoDB's semantics on the operations bucketq issues, checked
against mongomock where mongomock is right and against the test server; the operation log; fault injection;
change streams; and a queue on it needing no server."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import bson
import mongomock
import pytest
from bson import DatetimeMS, Int64, ObjectId
from bson.codec_options import CodecOptions, DatetimeConversion
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient, ReturnDocument
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    DocumentTooLarge,
    DuplicateKeyError,
    OperationFailure,
    WriteError,
)

import bucketq
from bucketq.core import claims, sharding
from bucketq.core.stats import stats_pipeline
from bucketq.memory import MemoryClient, MemoryDatabase, Unsupported
from bucketq.store.aio.base import insert_new
from bucketq.store.aio.queue_store import AsyncQueueStore
from tests.helpers import eventually, examples, next_message, utc_now

pytestmark = pytest.mark.memory  # the tests that use mongo_uri are marked server too, and make unit skips them

UTC = dt.timezone.utc
QUICK = {"bucket_max_wait": 0.005, "poll_interval": 0.01, "drain_timeout": 0}


def _now() -> dt.datetime:
    now = utc_now()
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _bucket(n: Any = 2, **fields: Any) -> dict[str, Any]:
    past = _now() - dt.timedelta(seconds=5)
    return {"_id": ObjectId(), "v": 1, "enc": "json", "created": past, "due": past, "n": n,
            "p": ['"m"'] * (n if isinstance(n, int) else 1), "done": [], "c": 0, "lease": None, **fields}


@pytest.fixture
def db() -> Any:
    """A synchronous view of a fresh in-memory database."""
    return MemoryDatabase("t").sync


# -- MongoDB's semantics --------------------------------------------------------------------------------------

def test_a_duplicate_id_raises_as_pymongo_raises_it(db):
    db.c.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError) as one:
        db.c.insert_one({"_id": 1})
    assert one.value.code == 11000
    with pytest.raises(BulkWriteError) as many:
        db.c.insert_many([{"_id": 2}, {"_id": 1}, {"_id": 3}], ordered=False)
    assert [(e["index"], e["code"]) for e in many.value.details["writeErrors"]] == [(1, 11000)]
    assert many.value.details["nInserted"] == 2
    with pytest.raises(BulkWriteError):
        db.c.insert_many([{"_id": 4}, {"_id": 1}, {"_id": 5}])  # ordered: stops at the duplicate
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2, 3, 4]


async def test_the_stores_insert_counts_a_duplicate_as_stored_and_other_errors_as_failed():
    database = MemoryDatabase("t")
    store = AsyncQueueStore(database, "q")
    docs = [{"_id": 1, "x": 1}, {"_id": 2, "x": 2}]
    assert await insert_new(store.buckets, docs) == {}
    assert await insert_new(store.buckets, docs) == {}, "an insert retried after a lost reply is stored"
    assert await store.buckets.count_documents({}) == 2


@pytest.mark.parametrize("doc, update, code", [
    ({"c": "x"}, {"$inc": {"c": 1}}, 14),  # what claim_uncounted exists for
    ({"c": Int64(2**63 - 1)}, {"$inc": {"c": 1}}, 2),  # MongoDB refuses the overflow (the test server wraps)
    ({"done": "y"}, {"$addToSet": {"done": {"$each": [1]}}}, 2),
    ({"lease": None}, {"$set": {"lease.until": 1}}, 28),
    ({"c": 0}, {"$set": {"c": 1}, "$inc": {"c": 1}}, 40),
    ({"c": 0}, {"$set": {"_id": 5}}, 66),
])
def test_updates_that_mongodb_refuses_are_write_errors_and_change_nothing(db, doc, update, code):
    db.c.insert_one({"_id": 1, **doc})
    before = db.c.find_one()
    with pytest.raises(WriteError) as caught:
        db.c.update_one({"_id": 1}, update)
    assert caught.value.code == code and isinstance(caught.value, OperationFailure)
    assert db.c.find_one() == before


def test_inc_keeps_a_long_a_long_and_add_to_set_adds_each_value_once(db):
    db.c.insert_one({"_id": 1, "c": Int64(5), "done": [0, 1]})
    db.c.update_one({"_id": 1}, {"$inc": {"c": 1}, "$addToSet": {"done": {"$each": [1, 2, 2, 1.0]}}})
    doc = db.c.find_one()
    assert type(doc["c"]) is Int64 and doc["c"] == 6
    assert doc["done"] == [0, 1, 2]


def test_queries_compare_in_bson_order_with_type_bracketing(db):
    now = _now()
    db.c.insert_many([{"_id": 1, "due": now, "c": 1}, {"_id": 2, "due": "soon", "c": True},
                      {"_id": 3, "c": [1, 2]}, {"_id": 4, "due": None, "c": "x"}, {"_id": 5, "due": 7, "c": 2.5}])
    ids = lambda q: sorted(d["_id"] for d in db.c.find(q))  # noqa: E731
    assert ids({"due": {"$lte": now}}) == [1], "a date compared with other types"
    assert ids({"c": {"$type": "number"}}) == [1, 3, 5], "booleans are not numbers; an array of numbers is"
    assert ids({"c": {"$not": {"$type": "number"}}}) == [2, 4]
    assert ids({"c": {"$type": "array"}}) == [3]
    assert ids({"due": None}) == [3, 4] and ids({"due": {"$exists": False}}) == [3]
    assert ids({"$or": [{"c": {"$gt": 1}}, {"due": "soon"}]}) == [2, 3, 5]
    assert [d["_id"] for d in db.c.find(sort=[("due", 1), ("_id", -1)])] == [4, 3, 5, 2, 1]


def test_documents_come_back_as_a_driver_decodes_them(db):
    stamp = dt.datetime(2030, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
    db.c.insert_many([{"_id": 1, "at": stamp, "t": (1, 2), "n": Int64(3)}, {"_id": 2, "far": DatetimeMS(2**62)}])
    naive = db.c.find_one({"_id": 1})
    assert naive["at"] == stamp.replace(tzinfo=None, microsecond=678_000)  # milliseconds, naive UTC by default
    aware = db.c.with_options(codec_options=CodecOptions(tz_aware=True, tzinfo=UTC)).find_one({"_id": 1})
    assert aware["at"] == stamp.replace(microsecond=678_000) and aware["at"].tzinfo is not None
    assert naive["t"] == [1, 2] and type(naive["n"]) is Int64
    with pytest.raises(bson.errors.InvalidBSON):  # beyond datetime's range, as a driver raises by default
        db.c.find_one({"_id": 2})
    auto = db.c.with_options(codec_options=CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO))
    assert auto.find_one({"_id": 2})["far"] == DatetimeMS(2**62)
    with pytest.raises(bson.errors.InvalidDocument):
        db.c.insert_one({"x": object()})


def test_documents_over_16_mib_are_refused(db):
    with pytest.raises(DocumentTooLarge):
        db.c.insert_one({"x": "a" * (16 * 1024 * 1024)})
    db.c.insert_one({"_id": 1, "x": "a" * (9 * 1024 * 1024)})
    with pytest.raises(WriteError) as caught:
        db.c.update_one({"_id": 1}, {"$set": {"y": "b" * (8 * 1024 * 1024)}})
    assert caught.value.code == 17419
    assert db.c.count_documents({}) == 1


def test_reads_create_no_collection_and_upserts_keep_what_exists(db):
    assert db.c.find_one({}) is None and db.c.count_documents({}) == 0
    assert db.list_collection_names() == []
    assert db.c.update_one({"_id": "p"}, {"$setOnInsert": {"paused": False}}, upsert=True).upserted_id == "p"
    db.c.update_one({"_id": "p"}, {"$set": {"paused": True}})
    assert db.c.update_one({"_id": "p"}, {"$setOnInsert": {"paused": False}}, upsert=True).upserted_id is None
    assert db.c.find_one() == {"_id": "p", "paused": True}
    assert db.list_collection_names() == ["c"]


def test_stats_count_malformed_documents_as_mongodb_does(db):
    now = _now()
    later = now + dt.timedelta(seconds=50)
    db.e.insert_many([_bucket(n="x", done="y", created=5), _bucket(1, created="s"), _bucket(1, due="soon", lease="z"),
                      _bucket(2), _bucket(3, done=[1], due=later, lease={"token": "t"}), _bucket(3, due=later),
                      {"_id": ObjectId(), "v": 1, "due": claims.TOMBSTONE_DUE, "fin": {"token": "t", "at": now}}])
    (row,) = db.e.aggregate(stats_pipeline(now, 1))
    # the bucket whose due is text is no claim's: left out, and counted apart (``core.strays``)
    assert (row["buckets"], row["ready"], row["scheduled"], row["in_flight"]) == (5, 3, 3, 2)
    assert abs(row["oldest_ready"] - (now - dt.timedelta(seconds=5)).replace(tzinfo=None)) < dt.timedelta(seconds=1)


def test_what_is_not_implemented_says_so(db):
    with pytest.raises(Unsupported):
        db.c.find_one({"$where": "true"})
    with pytest.raises(Unsupported):
        db.c.update_one({}, {"$rename": {"a": "b"}})
    with pytest.raises(Unsupported):
        list(db.c.aggregate([{"$lookup": {}}]))
    assert isinstance(Unsupported("x"), bucketq.BucketqError)


# -- against mongomock, on bucketq's own operations -----------------------------------------------------------

_SLOTS = st.lists(st.integers(0, 7), unique=True, max_size=4).map(sorted)
_STEPS = st.lists(st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(["t1", "t2"]), st.floats(-5, 60)),
    st.tuples(st.just("extend"), st.sampled_from(["t1", "t2"]), _SLOTS),
    st.tuples(st.just("release"), st.sampled_from(["t1", "t2"]), _SLOTS, st.booleans()),
    st.tuples(st.just("finish"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("reap"), st.floats(0, 10)),
), max_size=12)


def _step(collection: Any, step: tuple, now: dt.datetime) -> Any:
    """One of bucketq's writes, as ``AsyncQueueStore`` issues it, on a sync collection (mongomock or ours)."""
    kind, *args = step
    if kind == "claim":
        token, lease = args
        query, update, sort = claims.claim(now, lease, token, "host:1", expired_by=now, partition=0)
        return collection.find_one_and_update(query, update, sort=sort, return_document=ReturnDocument.AFTER)
    if kind == "reap":
        return collection.delete_many(claims.reap(now + dt.timedelta(seconds=args[0]), 1.0)).deleted_count
    token = args[0]
    doc = collection.find_one({"lease.token": token}, {"_id": 1, "pt": 1})
    if doc is None:
        return None
    fence = claims.fenced(sharding.key(doc), token)
    if kind == "extend":
        return collection.update_one(fence, claims.extend(now, 30, args[1])).matched_count
    if kind == "release":
        return collection.update_one(fence, claims.release(now, token, args[1], count_claim=args[2])).matched_count
    return collection.replace_one(fence, claims.finish(now, token, doc.get("pt"))).matched_count


def _outcome(collection: Any, step: tuple, now: dt.datetime) -> Any:
    """What a step returns, or the kind of error it raises (codes differ: the test server's are older ones)."""
    try:
        return _comparable(_step(collection, step, now))
    except OperationFailure as exc:
        return type(exc).__name__


def _comparable(value: Any) -> Any:
    """Documents with dates as milliseconds (mongomock returns other tzinfo objects)."""
    if isinstance(value, dt.datetime):
        return int(value.replace(tzinfo=value.tzinfo or UTC).timestamp() * 1000)
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _seed() -> list[dict[str, Any]]:
    return [_bucket(8, due=_now() - dt.timedelta(seconds=i)) for i in range(3)]


def _agree(theirs: Any, docs: list[dict[str, Any]], steps: list[tuple], *, stats: bool = False) -> None:
    """Seed ``docs`` into ``theirs`` and into a fresh in-memory collection, run ``steps`` on both, and check
    after each step that both returned, and hold, the same (and, with ``stats``, count the same)."""
    ours = MemoryDatabase("t", client=MemoryClient(codec_options=CodecOptions(tz_aware=True))).sync.events
    for collection in (ours, theirs):
        collection.insert_many([dict(d) for d in docs])
    now = _now()
    for step in steps:
        assert _outcome(ours, step, now) == _outcome(theirs, step, now), step
        assert _comparable(list(ours.find())) == _comparable(list(theirs.find())), step
        if stats:
            assert (_comparable(list(ours.aggregate(stats_pipeline(now, 1))))
                    == _comparable(list(theirs.aggregate(stats_pipeline(now, 1))))), step
    for query in (claims.LIVE, {"due": {"$lte": now}}, {"done": {"$in": [1, 2]}}, {"lease.owner": "host:1"}):
        assert ours.count_documents(query) == theirs.count_documents(query), query


@settings(max_examples=examples(60), deadline=None)
@given(steps=_STEPS)
def test_bucketqs_writes_agree_with_mongomock(steps):
    """Claims, extensions, releases, finishes and reaps, in any order, leave the same documents and return the
    same results in both engines. (Only ``$addToSet`` with unique values: mongomock adds an ``$each`` value
    twice, see the module docstring of ``bucketq.memory``.)"""
    _agree(mongomock.MongoClient(tz_aware=True).t.events, _seed(), steps)


# -- against the test server -----------------------------------------------------------------------------------

@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
def test_bucketqs_writes_agree_with_the_server(mongo_uri, steps):
    """The same on the MongoDB-wire test server, with malformed buckets, plus the stats aggregation (which
    mongomock gets wrong)."""
    name = f"bq_mem_{ObjectId()}"
    with MongoClient(mongo_uri, tz_aware=True) as client:
        try:
            _agree(client[name].events,
                   _seed() + [_bucket(1, due="soon", lease="z"), _bucket(n="x", done="y", created=5)],
                   steps, stats=True)
        finally:
            client.drop_database(name)


def test_inc_on_a_string_fails_alike_on_the_server(mongo_uri, db):
    with MongoClient(mongo_uri) as client:
        name = f"bq_mem_{ObjectId()}"
        try:
            codes = []
            for collection in (client[name].c, db.c):
                collection.insert_one({"_id": 1, "c": "x"})
                with pytest.raises(WriteError) as caught:
                    collection.update_one({"_id": 1}, {"$inc": {"c": 1}})
                codes.append(caught.value.code)
            assert codes == [14, 14]
        finally:
            client.drop_database(name)


# -- the operation log and faults -------------------------------------------------------------------------------

async def test_every_operation_is_recorded_and_state_is_written_per_bucket():
    database = MemoryDatabase("shop")
    producer = bucketq.Queue(database, name="events", bucket_max_size=1000, **QUICK)
    await producer.push_many(range(10_000))
    await producer.close()
    inserts = database.operations.of("insert", collection="events")
    assert sum(len(op.ids) for op in inserts) == 10 and all(len(op.ids) <= 8 for op in inserts)
    database.operations.clear()
    q = bucketq.Queue(database, name="events", change_streams=False)
    for _ in range(10_000):
        message = await next_message(q)
        await message.ack()
    await q.close()
    writes = database.operations.of("findAndModify", "update", "delete", collection="events")
    assert len(writes) <= 10 * 3 + 5, f"{len(writes)} writes: state is written per message, not per bucket"
    assert database.operations[0].command == "isMaster" and database.operations[0].collection is None
    # the finishes, each a fenced replacement by a tombstone: gathered into bulk writes while the queue had a backlog
    # (consumer.finishing), the last one alone
    bulk = database.operations.of("bulk_write", collection="events")
    gathered = [request for op in bulk for request in op.update]
    lone = database.operations.of("replace_one", collection="events")
    assert len(gathered) + len(lone) == 10 and len(bulk) < len(gathered) and lone
    assert all(op.command == "update" for op in bulk + lone)
    assert all("lease.token" in r._filter and r._doc["fin"] for r in gathered)
    assert all("lease.token" in op.filter and op.update["fin"] for op in lone)


async def test_finish_linger_0_writes_each_finish_at_once():
    database = MemoryDatabase("shop")
    producer = bucketq.Queue(database, name="events", bucket_max_size=100, **QUICK)
    await producer.push_many(range(1000))
    await producer.close()
    database.operations.clear()
    q = bucketq.Queue(database, name="events", change_streams=False, finish_linger=0)
    for _ in range(1000):
        message = await next_message(q)
        await message.ack()
    await q.close()
    assert not database.operations.of("bulk_write", collection="events")
    assert len(database.operations.of("replace_one", collection="events")) == 10


async def test_a_lost_reply_is_applied_and_raises_auto_reconnect():
    database = MemoryDatabase()
    fault = database.faults.lose_reply("insert", collection="c")
    with pytest.raises(AutoReconnect):
        await database.c.insert_one({"_id": 1})
    database.faults.lose_reply("insert")
    with pytest.raises(AutoReconnect):  # even an error (here a duplicate key) is lost with the reply
        await database.c.insert_one({"_id": 1})
    assert await database.c.count_documents({}) == 1 and fault.hits == 1
    assert [op.fault for op in database.operations.of("insert")] == ["lose_reply", "lose_reply"]


async def test_a_refused_operation_is_not_applied():
    database = MemoryDatabase()
    database.faults.refuse("update_one")
    database.faults.refuse("insert", error=WriteError("no space", 14031))
    with pytest.raises(WriteError, match="no space"):
        await database.c.insert_one({"_id": 1})
    await database.c.insert_one({"_id": 1})
    with pytest.raises(AutoReconnect):
        await database.c.update_one({"_id": 1}, {"$set": {"x": 1}})
    assert await database.c.find_one() == {"_id": 1}


async def test_a_delayed_operation_holds_back_only_itself():
    database = MemoryDatabase()
    release = asyncio.Event()
    held = database.faults.delay("insert", until=release, where=lambda op: op.ids == ("slow",))
    timed = database.faults.delay("find", seconds=0.1)
    slow = asyncio.ensure_future(database.c.insert_one({"_id": "slow"}))
    await database.c.insert_one({"_id": "fast"})
    started = time.monotonic()
    assert [d["_id"] for d in await database.c.find().to_list(None)] == ["fast"]
    assert time.monotonic() - started >= 0.1 and timed.hits == 1
    assert not slow.done() and held.hits == 1
    release.set()
    await slow
    assert await database.c.count_documents({}) == 2


async def test_faults_act_in_the_order_armed_and_disarm():
    database = MemoryDatabase()
    first = database.faults.refuse("insert", times=2)
    second = database.faults.refuse()
    for _ in range(3):
        with pytest.raises(AutoReconnect):
            await database.c.insert_one({"x": 1})
    assert (first.hits, second.hits) == (2, 1)
    database.faults.refuse(times=5)
    database.faults.disarm()
    await database.c.insert_one({"x": 1})
    with pytest.raises(ValueError):
        database.faults.refuse(times=0)


async def test_pushes_survive_lost_requests_and_fail_on_refusals():
    database = MemoryDatabase()
    q = bucketq.Queue(database, name="events", write_timeout=1.0, **QUICK)
    await q.push("warm")
    lost = database.faults.refuse("insert", times=2)  # requests lost on the way: retried
    assert await q.push("a")
    assert lost.hits == 2 and database.sync.events.count_documents({}) == 2
    database.faults.lose_reply("insert")  # applied, reply lost: the retry is a duplicate, counted as stored
    assert await q.push("b")
    database.faults.refuse("insert", error=WriteError("refused", 2))  # not retried
    with pytest.raises(bucketq.WriteFailed):
        await q.push("c")
    assert sorted(p for d in database.sync.events.find() for p in d["p"]) == ['"a"', '"b"', '"warm"']
    await q.close()


async def test_a_claim_whose_reply_was_lost_comes_back_after_its_lease_with_a_try_added():
    database = MemoryDatabase()
    q = bucketq.Queue(database, name="events", lease=1.0, state_flush_period=0.2, change_streams=False, **QUICK)
    await q.push("m")
    lost = database.faults.lose_reply("findAndModify")
    message = await q.reserve(timeout=3)
    assert lost.hits == 1 and message.payload == "m" and message.tries == 1
    await message.ack(wait=True)
    await q.close()


# -- change streams and the queue on it ------------------------------------------------------------------------

async def test_change_streams_deliver_inserts_including_recent_ones():
    database = MemoryDatabase()
    await database.c.insert_one({"_id": "before"})
    start = bson.Timestamp(int(time.time()) - 1, 0)
    stream = await database.c.watch([{"$match": {"operationType": "insert"}}], start_at_operation_time=start,
                                    max_await_time_ms=50)
    await database.other.insert_one({"_id": "elsewhere"})
    await database.c.insert_one({"_id": "after"})
    events = [await stream.try_next(), await stream.try_next(), await stream.try_next()]
    assert [e["documentKey"]["_id"] for e in events if e] == ["before", "after"] and events[2] is None
    await stream.close()
    closed = MemoryDatabase(client=MemoryClient(change_streams=False))
    with pytest.raises(OperationFailure):
        await closed.c.watch()


async def test_change_streams_deliver_updates_with_their_description_and_replacements():
    """As MongoDB does: an update event has ``updateDescription`` (here by top-level field) and no document
    unless ``updateLookup`` is asked for; a replacement has its document; a write that changes nothing and a
    delete make no event (deletes are not implemented)."""
    database = MemoryDatabase()
    await database.c.insert_one({"_id": 1, "lease": {"until": 5}, "w": True, "n": 0})
    start = bson.Timestamp(int(time.time()), 0)
    plain = await database.c.watch([{"$match": {"operationType": {"$ne": "insert"}}}],
                                   start_at_operation_time=start, max_await_time_ms=50)
    looked_up = await database.c.watch([{"$match": {"operationType": "update"}}], full_document="updateLookup",
                                       max_await_time_ms=50)
    await database.c.update_one({"_id": 1}, {"$set": {"lease": None, "n": 0}, "$unset": {"w": ""}})
    await database.c.update_one({"_id": 1}, {"$set": {"n": 0}})  # changes nothing
    await database.c.replace_one({"_id": 1}, {"fin": True})
    update, replace, nothing = [await plain.try_next() for _ in range(3)]
    assert update["operationType"] == "update" and "fullDocument" not in update
    assert update["updateDescription"] == {"updatedFields": {"lease": None}, "removedFields": ["w"]}
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "fin": True}
    assert nothing is None
    assert (await looked_up.try_next())["fullDocument"] == {"_id": 1, "lease": None, "n": 0}
    await plain.close()
    await looked_up.close()


@pytest.mark.parametrize("change_streams", [True, False])
async def test_an_idle_consumer_wakes_by_stream_or_by_polling(change_streams):
    database = MemoryDatabase(client=MemoryClient(change_streams=change_streams))
    consumer = bucketq.Queue(database, name="events", **{**QUICK, "poll_interval": 0.1})
    producer = bucketq.Queue(database, name="events", **QUICK)
    try:  # closed even when an assertion fails, so that no background task outlives the test's event loop
        assert await consumer.reserve(timeout=0.3) is None
        waiter = asyncio.ensure_future(consumer.reserve(timeout=20))
        await asyncio.sleep(0.2)
        if change_streams:  # the stream's first answer sets the flag; without streams it never is
            await eventually(lambda: consumer._wakeup.streaming, what="the change stream running")
        pushed = time.monotonic()
        await producer.push("hello")
        message = await waiter
        # woken (a poll comes every 0.1 s, a stream event at once), not left waiting out the reserve's 20 s;
        # how soon is the bench's to measure
        assert message is not None and time.monotonic() - pushed < 10
        assert consumer._wakeup.streaming is change_streams
        await message.ack()
    finally:
        await asyncio.gather(consumer.close(), producer.close())


async def test_a_queue_takes_a_memory_client_or_database_and_its_db_option():
    client = MemoryClient()
    async with bucketq.Queue(client, name="a", db="one", **QUICK) as q:
        await q.push(1)
    async with bucketq.Queue(client["two"], name="a", db="one", **QUICK) as q:
        assert (await q.stats())["ready"] == 1
    assert client["one"].sync.list_collection_names()[0] == "a"
    assert client["two"].sync.list_collection_names() == []
    assert isinstance(bucketq.Queue(client, name="a").database, MemoryDatabase)


# -- notablescan: every query served by an index ---------------------------------------------------------------

async def test_notablescan_refuses_what_no_index_serves_and_names_the_query_and_the_indexes():
    from bucketq.core.scans import SCAN

    db = MemoryClient(notablescan=True)["t"]
    db.sync.c.insert_many([{"_id": i, "due": i, "s": i, "k": str(i), **({"g": "a"} if i % 2 else {})}
                           for i in range(6)])
    await db.c.create_index("due")
    await db.c.create_index([("g", 1), ("s", 1)], sparse=True)
    with pytest.raises(OperationFailure, match=r"no index serves filter \{'k': '1'\}.*_id_ \{'_id': 1\}, due_1") as e:
        await db.c.find_one({"k": "1"})
    assert e.value.code == 291
    assert db.sync.c.find_one({"k": "1"})["_id"] == 1  # the test's own view is not checked
    assert (await db.c.find_one({"k": "1"}, **SCAN))["_id"] == 1  # an operator's scan, declared
    assert (await db.c.find_one({"_id": 3}))["_id"] == 3
    assert (await db.c.find_one({"due": {"$lte": 2}, "$or": [{"k": "1"}, {"k": "2"}]}, sort=[("due", 1)]))["_id"] == 1
    assert (await db.c.find_one({"g": "a"}, sort=[("s", 1)]))["_id"] == 1  # equality, then the sort
    assert (await db.c.find_one({}, sort=[("due", -1)]))["_id"] == 5  # the sort alone, backwards
    assert await db.c.count_documents({"$or": [{"_id": 1}, {"due": 4}]}) == 2  # each branch on an index of its own
    assert await db.c.count_documents({"g": {"$exists": True}}) == 3  # a sparse index holds those
    for query, sort in [({"g": None}, None),  # a sparse index lacks the documents without the field
                        ({}, [("s", 1)]), ({"$or": [{"_id": 1}, {"k": "4"}]}, None), ({"s": {"$gt": 1}}, None)]:
        with pytest.raises(OperationFailure, match="notablescan"):
            await db.c.find_one(query, sort=sort)
    with pytest.raises(OperationFailure, match="notablescan"):
        await db.c.update_many({"k": "1"}, {"$set": {"x": 1}})
    with pytest.raises(OperationFailure, match="notablescan"):
        await db.c.delete_one({"s": 2})
    with pytest.raises(OperationFailure, match="notablescan"):
        await (await db.c.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}}}])).to_list(None)
    assert await (await db.c.aggregate([{"$match": {"due": {"$gte": 4}}}, {"$count": "n"}])).to_list(None) == [{"n": 2}]
    assert await db.missing.find_one({"k": 1}) is None  # a collection that does not exist: nothing to scan

"""The guarantees (docs/guarantees.md) under injected faults: lost replies and late retries, takeovers by
another consumer, clock steps, slow writes, bad stored input, shutdown with the server gone. Each test
injects the fault that would break its guarantee and fails on the code before the fix."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from collections.abc import Callable
from typing import Any

import bson
import pytest
from bson import DatetimeMS, ObjectId
from pymongo.errors import PyMongoError

import bucketq
from bucketq.core import claims
from bucketq.core.format import BSON_LIMIT, FORMAT_VERSION, MAX_BUCKET_BYTES
from bucketq.memory import Fault, Faults, Operation
from tests.helpers import eventually, no_background_housekeeping, seconds_ago, served, server_proxy
from tests.proxy import TcpProxy

pytestmark = pytest.mark.backends("memory", "server")

UTC = dt.timezone.utc
LIVE = {"fin": {"$exists": False}}
QUICK = {"bucket_max_wait": 0.005, "change_streams": False, "poll_interval": 0.02, "drain_timeout": 0}


def _raw_bucket(**fields: Any) -> dict:
    doc = {"_id": ObjectId(), "v": FORMAT_VERSION, "enc": "json", "due": seconds_ago(), "created": seconds_ago(),
           "n": 1, "p": ['"raw"'], "done": [], "c": 0, "lease": None}
    doc.update(fields)
    return doc


async def _take_over(make_queue: Callable[..., bucketq.Queue], payloads: list[Any]) -> tuple[Any, ...]:
    """A serves every message of one bucket, then hangs past its lease; B claims the bucket and serves
    them again. Returns (a, b, a's messages, b's messages)."""
    options = {**QUICK, "lease": 1.0, "state_flush_period": 0.2}
    a, b = make_queue(**options), make_queue(**options)
    await a.push_many(payloads)
    mine = [await a.reserve(timeout=5) for _ in payloads]
    a._consumer._flushing.stop()  # A hangs (a GC pause, a partition): its lease is not extended
    theirs = [await b.reserve(timeout=5) for _ in payloads]  # B polls: it claims once A's lease has run out
    assert all(m is not None and m.tries == 1 for m in theirs), "B did not take the bucket over"
    return a, b, mine, theirs


# -- 1. a retried fenced write is ours only if it carries our token -----------------------------------------

def _by(message: bucketq.Message) -> Callable[[Operation], bool]:
    """Matches the operations fenced by the lease ``message`` was served under."""
    token = message._holding.held.token
    return lambda op: isinstance(op.filter, dict) and op.filter.get("lease.token") == token


async def test_a_stale_consumers_retried_write_is_refused_not_inferred_from_someone_elses_acks(make_queue, sync_db,
                                                                                               memory_db):
    _, b, mine, theirs = await _take_over(make_queue, ["acked-by-b", "also-acked-by-b", "left"])
    await theirs[0].ack()
    await theirs[1].ack(wait=True)  # B's flush marks slots 0 and 1 done
    # A's guard write: reply lost, then retried
    lost = memory_db.faults.lose_reply("update_one", collection="events", where=_by(mine[0]))
    await mine[0].ack()
    with pytest.raises(bucketq.LeaseLost):
        await mine[1].nack(delay=0, wait=True)  # before the fix: "applied" (slots 0, 1 are done: B's work)
    assert lost.hits == 1
    await theirs[2].ack(wait=True)
    assert await served(b) == [], "a message B acked came back through A's retry copy"
    assert sync_db.events.count_documents(LIVE) == 0


async def test_a_retried_finish_that_finds_the_bucket_finished_by_another_consumer_raises_lease_lost(make_queue,
                                                                                                   memory_db):
    _, _, mine, theirs = await _take_over(make_queue, ["m"])
    await theirs[0].ack(wait=True)  # B finishes the bucket: its tombstone carries B's token
    lost = memory_db.faults.lose_reply("replace_one", collection="events", where=_by(mine[0]))
    with pytest.raises(bucketq.LeaseLost):
        await mine[0].ack(wait=True)  # before the fix: the retry found the bucket gone and reported success
    assert lost.hits == 1


async def test_a_retried_finish_that_did_apply_is_recognised_by_its_token(make_queue, sync_db, memory_db):
    q = make_queue(**QUICK)
    await q.push("m")
    message = await q.reserve(timeout=5)
    lost = memory_db.faults.lose_reply("replace_one", collection="events")
    await message.ack(wait=True)  # applied, reply lost, retried: no LeaseLost
    assert lost.hits == 1
    assert [d["fin"]["token"] for d in sync_db.events.find()] == [message._holding.held.token]


async def test_a_gathered_finish_whose_reply_was_lost_is_recognised_by_its_token(make_queue, sync_db, memory_db):
    """Finishes written together (``consumer.finishing``: acks nobody waits for, a backlog of buckets of 64), their
    bulk write's reply lost: the retry finds each bucket's tombstone by its own token, so none counts as a lost
    lease, and none comes back."""
    q = make_queue(**QUICK, bucket_max_size=64)
    await q.push_many(list(range(3 * 64)))  # three buckets
    lost = memory_db.faults.lose_reply("bulk_write", collection="events")
    messages = []
    for _ in range(3 * 64):  # each acked as it comes: the next bucket is claimed ahead while one is served
        messages.append(message := await q.reserve(timeout=5))
        await message.ack()
    held = list({id(m._holding): m._holding.held for m in messages}.values())
    await eventually(lambda: all(h.ended for h in held), what="every bucket finished")
    assert lost.hits == 1
    assert not any(h.lost for h in held), "a finish that applied was taken for a lost lease"
    assert sorted(d["fin"]["token"] for d in sync_db.events.find()) == sorted(h.token for h in held)
    assert await make_queue(**QUICK).reserve(timeout=0.5) is None


async def test_a_stale_consumers_gathered_finish_is_refused_where_another_finished_the_bucket(make_queue, sync_db):
    """A serves a bucket of 64 (the next one claimed ahead: a backlog, so its finish is gathered), then hangs past
    its lease; B takes the bucket over and finishes it. A's acks then finish it too, in a gathered write fenced by
    A's token: refused, and B's tombstone stays."""
    options = {**QUICK, "lease": 1.0, "state_flush_period": 0.2, "bucket_max_size": 64}
    a, b = make_queue(**options), make_queue(**options)
    await a.push_many(list(range(2 * 64)))
    mine = [await a.reserve(timeout=5) for _ in range(64)]
    await a._consumer._claiming.ahead_landed()  # bucket 2 is A's: B can only take bucket 1 over
    a._consumer._flushing.stop()  # A hangs: its leases are not extended
    theirs = [await b.reserve(timeout=5) for _ in range(64)]
    first = mine[0]._holding.held
    assert all(m._holding.held.bucket.id == first.bucket.id and m.tries == 1 for m in theirs), "B took another bucket"
    await b.ack_many(theirs, wait=True)  # B finishes the bucket: its tombstone carries B's token
    await a.ack_many(mine)
    await eventually(lambda: first.ended, what="A's finish written")
    assert first.lost, "A's finish counted as applied"
    assert sync_db.events.find_one({"_id": first.bucket.id})["fin"]["token"] == theirs[0]._holding.held.token


async def test_a_retried_release_that_did_apply_is_recognised_by_its_token(make_queue, sync_db, memory_db):
    q = make_queue(**QUICK)
    await q.push_many(["served", "unserved"])
    served = await q.reserve(timeout=5)
    await served.ack()
    lost = memory_db.faults.lose_reply("update_one", collection="events")
    await q.drain()  # the release's reply is lost; its retry matches nothing but finds its own token
    assert lost.hits == 1
    doc = sync_db.events.find_one()
    assert doc["lease"] is None and doc["c"] == 0 and doc["done"] == [0]
    other = make_queue(**QUICK)
    again = await other.reserve(timeout=5)
    assert again.payload == "unserved" and again.tries == 0


# -- 2. an insert retried late cannot store a finished bucket again -----------------------------------------

def _late_retry(faults: Faults, consumed: asyncio.Event) -> Fault:
    """The next insert into the queue applies and loses its reply; its retry waits until ``consumed``."""
    faults.lose_reply("insert", collection="events")
    return faults.delay("insert", collection="events", until=consumed)  # by when the bucket was consumed


@pytest.mark.parametrize("source", ["producer", "nack", "requeue_dead", "requeue_quarantined"])
async def test_an_insert_retried_after_its_bucket_was_consumed_stores_nothing_again(make_queue, sync_db, memory_db,
                                                                                   source):
    q = make_queue(**QUICK, max_attempts=1 if source == "requeue_dead" else 5)
    consumer = make_queue(**QUICK)
    consumed = asyncio.Event()
    if source == "producer":
        late = _late_retry(memory_db.faults, consumed)
        writing = asyncio.ensure_future(q.push("once"))
    else:
        if source == "requeue_quarantined":
            sync_db.events.insert_one(_raw_bucket(v=99))
            assert await q.reserve(timeout=0.5) is None  # quarantined
            sync_db["events.quarantine"].update_one({}, {"$set": {"doc.v": FORMAT_VERSION}})  # mended
        else:
            await q.push("once")
            first = await q.reserve(timeout=5)
            if source == "requeue_dead":
                await first.nack(wait=True)  # max_attempts=1: straight to the dead letters
        late = _late_retry(memory_db.faults, consumed)
        if source == "nack":
            writing = asyncio.ensure_future(first.nack(delay=0, wait=True))
        elif source == "requeue_dead":
            writing = asyncio.ensure_future(q.requeue_dead())
        else:
            writing = asyncio.ensure_future(q.requeue_quarantined())
    message = await consumer.reserve(timeout=5)
    assert message is not None
    await message.ack(wait=True)  # the bucket is finished
    consumed.set()
    await writing
    assert late.hits == 1, "the insert was not retried late"
    assert await consumer.reserve(timeout=0.5) is None, "a bucket was stored again after it was consumed"


# -- 3. headers are what they were at push time ---------------------------------------------------------------

async def test_headers_changed_after_push_nowait_change_nothing_stored(make_queue):
    q = make_queue(**QUICK, bucket_max_bytes=64 * 1024, max_buffered_bytes=1 << 20)
    headers = {"trace": "t-1", "nested": {"a": [1]}}
    future = q.push_nowait("m", headers=headers)
    headers["trace"] = "changed"
    headers["nested"]["a"].append(2)
    headers["big"] = "x" * 200_000  # would not fit the bucket: it must not bypass the size check
    await future
    message = await q.reserve(timeout=5)
    assert message.headers == {"trace": "t-1", "nested": {"a": [1]}}


# -- 7. no document the library writes exceeds 16 MiB --------------------------------------------------------

@pytest.mark.slow
async def test_full_buckets_near_the_size_limit_are_claimed_acked_and_nacked_within_16_mib(make_queue, sync_db):
    """Two buckets of the most messages a bucket holds, near its byte limit. The first is acked but for one
    message, so its ``done`` array is as long as it gets; the second is nacked whole, and the retry copies
    (which add ids, tries and enqueue times) must be split. Every stored document stays below 16 MiB."""
    n = 65536
    q = make_queue(**{**QUICK, "bucket_max_wait": 5}, bucket_max_size=n, bucket_max_bytes=MAX_BUCKET_BYTES,
                   max_buffered_bytes=2 * MAX_BUCKET_BYTES, lease=300)
    await q.push_many(["x" * 210] * (2 * n))
    sizes = [len(bson.encode(doc)) for doc in sync_db.events.find()]
    assert len(sizes) == 2 and all(MAX_BUCKET_BYTES - 1_200_000 < size <= MAX_BUCKET_BYTES for size in sizes)
    first = [await q.reserve(timeout=5) for _ in range(n)]
    for message in first[:-2]:
        await message.ack()
    await first[-2].ack(wait=True)
    held = sync_db.events.find_one({"_id": first[0]._holding.held.bucket.id})
    assert len(held["done"]) == n - 1 and len(bson.encode(held)) < BSON_LIMIT
    second = [await q.reserve(timeout=5) for _ in range(n)]
    for message in [first[-1], *second]:
        await message.nack(delay=60)
    await q.drain()
    sizes = [len(bson.encode(doc)) for doc in sync_db.events.find(LIVE)]
    assert len(sizes) >= 2, "the nacked messages' retry copies must be split"
    assert all(size <= MAX_BUCKET_BYTES for size in sizes), sizes
    assert sum(doc["n"] for doc in sync_db.events.find(LIVE)) == n + 1


@pytest.mark.slow
async def test_a_bucket_at_the_size_limit_is_quarantined_within_16_mib(make_queue, sync_db):
    n = 65536
    payloads = ['"' + "y" * 200 + '"'] * (n - 1) + ["{not json"]
    doc = _raw_bucket(n=n, p=payloads)
    assert len(bson.encode(doc)) <= MAX_BUCKET_BYTES
    sync_db.events.insert_one(doc)
    q = make_queue(**QUICK)
    assert await q.reserve(timeout=2) is None
    entry = sync_db["events.quarantine"].find_one()
    assert entry["_id"] == doc["_id"] and len(bson.encode(entry)) < BSON_LIMIT


def _near_the_limit(room: int, **fields: Any) -> dict:
    """A one-message bucket (``fields`` added) that someone else wrote: ``room`` bytes below 16 MiB once claimed."""
    doc = _raw_bucket(**fields)
    claimed = {**doc, "lease": {"token": "0" * 24, "owner": claims.owner_name(), "until": seconds_ago()}}
    doc["p"] = ['"' + "w" * (BSON_LIMIT - room - len(bson.encode(claimed))) + '"']
    return doc


async def test_a_malformed_bucket_near_16_mib_is_stored_in_quarantine_without_its_largest_field(make_queue,
                                                                                                sync_db):
    """Its quarantine entry (the bucket and the reason, host, pid, time) would exceed 16 MiB: the entry is stored,
    without the bucket's largest field, named in ``omitted``; the bucket is counted quarantined only then."""
    doc = _near_the_limit(10, n=2)  # n says 2, p holds 1: malformed
    sync_db.events.insert_one(doc)
    q = make_queue(**QUICK)
    assert await q.reserve(timeout=0.5) is None
    entry = sync_db["events.quarantine"].find_one()
    assert entry is not None, "reported quarantined, but not in quarantine"
    assert len(bson.encode(entry)) <= BSON_LIMIT and entry["reason"] == "n is 2 but p holds 1 payloads"
    assert list(entry["omitted"]) == ["p"] and entry["doc"]["_id"] == doc["_id"] and entry["doc"]["n"] == 2
    row = await q.stats()
    assert (row["quarantined"], row["buckets"]) == (1, 0)


async def test_a_dead_letter_of_a_message_near_16_mib_is_stored_and_close_returns(make_queue, sync_db):
    """The dead letter of a message that fills its bucket, with a long error, would exceed 16 MiB: the error is
    cut, the payload kept whole, and the nack completes."""
    doc = _near_the_limit(1000)
    sync_db.events.insert_one(doc)
    q = make_queue(**QUICK, max_attempts=1)
    message = await q.reserve(timeout=2)
    await asyncio.wait_for(message.nack(error="E" * 4000, wait=True), 10)
    await asyncio.wait_for(q.close(), 10)
    letter = sync_db["events.dead"].find_one()
    assert letter is not None and len(bson.encode(letter)) <= BSON_LIMIT
    assert letter["p"] == doc["p"][0] and letter["error"].startswith("E" * 256)
    assert sync_db.events.count_documents(LIVE) == 0


async def test_a_nack_refused_as_too_large_fails_clearly_and_close_returns(make_queue, memory_db):
    """No room is left for the nack's lease extension (16 MiB enforced by the in-memory database, as by MongoDB):
    the nack raises ``WriteFailed`` instead of waiting for ever, close() returns, and the message is kept."""
    memory_db.sync.events.insert_one(_near_the_limit(8))
    q = make_queue(**QUICK)
    message = await q.reserve(timeout=2)
    with pytest.raises(bucketq.WriteFailed, match="too large"):
        await asyncio.wait_for(message.nack(delay=0, wait=True), 10)
    await asyncio.wait_for(q.close(), 10)
    assert memory_db.sync.events.count_documents(LIVE) == 1


@pytest.mark.slow
async def test_requeue_of_many_large_dead_letters_is_split_below_16_mib(make_queue, sync_db):
    big = '"' + "z" * (1 << 20) + '"'  # 1 MiB each: 40 of them do not fit one bucket
    sync_db["events.dead"].insert_many([
        {"_id": f"{ObjectId()}:0", "enc": "json", "p": big, "h": None, "k": None, "tries": 5, "error": "e",
         "at": seconds_ago(), "enqueued_at": seconds_ago(), "origin": {"bucket": ObjectId(), "slot": 0}}
        for _ in range(40)])
    q = make_queue(**QUICK)
    assert await q.requeue_dead() == 40
    sizes = [len(bson.encode(doc)) for doc in sync_db.events.find(LIVE)]
    assert len(sizes) >= 3 and all(size <= MAX_BUCKET_BYTES for size in sizes), sizes
    assert len(await served(q, want=40)) == 40


# -- 8. bad stored input goes to quarantine, never crashes or loops a consumer ------------------------------

BAD_BUCKETS = {
    "created out of range": {"created": DatetimeMS(2**62)},
    "enqueue time out of range": {"e": [DatetimeMS(-(2**62))]},
    "negative claim count": {"c": -5},
    "claim count near int64 max": {"c": bson.Int64(2**63 - 1)},
    "negative tries": {"t": [-10]},
    "tries near int64 max": {"t": [bson.Int64(2**63 - 2)]},
    "codec extra not installed": {"enc": "msgpack", "p": [b"\x81\xa1a\x01"]},
}


@pytest.mark.parametrize("fields", BAD_BUCKETS.values(), ids=BAD_BUCKETS.keys())
async def test_bad_stored_buckets_are_quarantined_and_the_good_message_is_served(make_queue, sync_db, fields,
                                                                                monkeypatch):
    monkeypatch.setitem(sys.modules, "msgpack", None)  # as if the msgpack extra were not installed
    bad = _raw_bucket(**fields)
    sync_db.events.insert_one(bad)
    q = make_queue(**QUICK, max_attempts=2)
    stats = await q.stats()
    assert stats["buckets"] == 1
    await q.push("good")
    assert await served(q, want=1) == ["good"]
    entries = await q.quarantined()
    assert [e["_id"] for e in entries] == [bad["_id"]] and entries[0]["reason"]


@pytest.mark.parametrize("lease", ["z", {"token": "t"}, {"token": "t", "until": "soon"}], ids=["text", "no until",
                                                                                         "text until"])
async def test_a_bucket_whose_lease_has_no_date_is_claimed_not_stuck(make_queue, sync_db, lease):
    """A claim takes over a lease only when its ``until`` is not past the earliest reading of the clock: a lease
    written by hand with no date ``until`` must not make its bucket unclaimable for ever."""
    sync_db.events.insert_one(_raw_bucket(lease=lease))
    q = make_queue(**QUICK)
    assert await served(q, want=1) == ["raw"]


async def test_stats_count_around_malformed_documents(make_queue, sync_db):
    sync_db.events.insert_many([_raw_bucket(n="x", done="y", created=5), _raw_bucket(created="s"),
                                _raw_bucket(due="soon", lease="z")])
    q = make_queue(**QUICK)
    await q.push_many([1, 2])
    stats = await q.stats()
    # 2 pushed and 1 in the well-counted bad ones; the one whose due is no date no claim can take: not a bucket
    assert stats["buckets"] == 3 and stats["ready"] == 3 and stats["not_buckets"] == 1


# -- 9. shutdown stops every background task, also when it fails ---------------------------------------------

async def test_a_failing_close_stops_every_background_task(mongo_uri, db_name, sync_db):
    proxy = TcpProxy.to(mongo_uri).start()
    q = bucketq.Queue(proxy.uri + "&serverSelectionTimeoutMS=300&connectTimeoutMS=300", name="events", db=db_name,
                      **QUICK, write_timeout=0.5, state_flush_period=0.05)
    try:
        await q.push_many(["a", "b"])
        assert await q.reserve(timeout=5) is not None
    finally:
        proxy.stop()  # the server is unreachable from now on
    # the driver's error, or the drain's WriteFailed when the release was still unanswered at its cut-off (which
    # of the two comes first depends on the machine's load)
    with pytest.raises((PyMongoError, bucketq.WriteFailed)):
        await q.close()
    consumer = q._consumer
    assert consumer._flushing._loop is None and not consumer._drainer._background.running()

    def leftover() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith("bucketq") and not t.done()]

    await eventually(lambda: not leftover(), what="every background task ended")  # cancelled ones end soon after


@pytest.mark.timeout(120)
async def test_drain_returns_within_drain_timeout_and_one_write_timeout_when_the_server_stops_answering(
        backend, make_queue, request):
    """The server takes requests and never answers the consumer's writes: a drain that released its buckets one
    after the other, each waiting for its reply, never returned (the full stress run's consumers took 300 s to
    stop). Now the releases run at once and are abandoned after one ``write_timeout``: their leases expire."""
    options = {**QUICK, "drain_timeout": 0.2, "write_timeout": 1.0, "bucket_max_size": 1}
    proxy = None
    if backend == "server":
        proxy = server_proxy(request, make_queue)
    q = make_queue(target=proxy and proxy.uri, **options)
    await q.push_many(["a", "b", "c"])
    held = [await q.reserve(timeout=5) for _ in range(3)]
    assert all(held)
    await held[0].ack()
    if proxy is None:
        request.getfixturevalue("memory_db").faults.delay(until=asyncio.Event(), times=10_000, collection="events")
    else:
        proxy.delay("update", "findAndModify", "delete", seconds=3600, times=10_000, collection="events")
    with pytest.raises(bucketq.WriteFailed, match="unanswered"):
        await asyncio.wait_for(q.close(), 30)  # a guard against hanging: the bound is 1.2 s


# -- 10. a wall-clock step does not shorten or lengthen leases -------------------------------------------------

async def test_a_wall_clock_step_does_not_let_two_consumers_serve_one_bucket(make_queue, sync_db, monkeypatch):
    sync_db.events.insert_one(_raw_bucket(due=seconds_ago(7200), created=seconds_ago(7200)))
    a = make_queue(**QUICK, lease=30)
    await a.stats()  # A measures the server clock
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)  # then its wall clock is stepped back an hour
    first = await a.reserve(timeout=2)
    assert first is not None
    monkeypatch.setattr(time, "time", real)
    b = make_queue(**QUICK)
    assert await b.reserve(timeout=0.5) is None, "B served a message A holds: A's lease was already expired"
    await first.ack(wait=True)


def test_a_clock_resync_takes_effect_at_once():
    from bucketq.shell.clock import ServerClock

    clock = ServerClock()
    before = clock.now()
    assert before.microsecond % 1000 == 0, "readings are truncated to BSON's milliseconds"
    now = time.monotonic()
    clock._take(now, now, {"localTime": before + dt.timedelta(hours=1)})  # the server's clock is an hour ahead
    after = clock.now()
    assert after - before >= dt.timedelta(minutes=59), "a reading cached for the current millisecond outlived the sync"
    assert after.microsecond % 1000 == 0 and clock.now() >= after


async def test_a_clock_read_slowed_down_does_not_let_two_consumers_serve_one_bucket(backend, make_queue, request):
    """B's clock sync waits a lease's length (3 s here) on its way to the server (a loaded server or host): the
    server reads its clock that long after B asked, so B's reading is up to half a lease ahead. A's lease
    extension is slow too. B judged A's lease expired by its reading and took A's bucket before A stopped
    serving it (the full stress run's ``lease_overlap`` duplicates). Now a claim judges by the earliest reading
    its error allows, and a holder by the latest. Every time below is a fraction of the lease: the lease is
    as short as the margins (0.15 and 0.25 of it) allow on a loaded machine."""
    lease = 3.0
    options = {**QUICK, "lease": lease, "bucket_max_size": 2}
    proxy = None
    if backend == "server":
        proxy = server_proxy(request, make_queue)
    faults = proxy or request.getfixturevalue("memory_db").faults
    a = make_queue(target=proxy and proxy.uri, **options)
    await a.push_many(["x", "y"])  # A has read the server's clock
    b = make_queue(target=proxy and proxy.uri, **options)
    slow_sync = faults.delay("isMaster", "hello", seconds=lease)
    await b.stats()  # B reads it, slowly
    assert slow_sync.hits == 1
    first = await a.reserve(timeout=2)
    assert first is not None and first.payload == "x"
    # A serves 0.9 of its lease (a 10% margin); its extension, sent halfway, lands at 1.5 leases
    slow_extension = faults.delay("update", "update_one", seconds=lease, collection="events")
    # At 0.75: A still serves (0.15 short of 0.9); B's reading, half a lease ahead, is a quarter past the end
    await asyncio.sleep(0.75 * lease)
    assert slow_extension.hits == 1
    assert await b.reserve(timeout=0) is None, "B took the bucket A still serves: two consumers held it at once"
    second = await a.reserve(timeout=0)
    assert second is not None and second.payload == "y", "A stopped serving a bucket it still held"
    await asyncio.gather(first.ack(wait=True), second.ack(wait=True))


def test_clock_readings_combine_to_the_overlap_of_their_errors():
    from bucketq.shell.clock import ServerClock

    clock = ServerClock()
    mono = time.monotonic()
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    clock._take(mono - 2.0, mono, {"localTime": base})  # a slow round trip: +-1 s (and the millisecond)
    assert abs(clock.error().total_seconds() - 1.001) < 0.01
    clock._take(mono - 0.01, mono, {"localTime": base + dt.timedelta(seconds=0.7)})  # a fast one, in the first's
    assert clock.error().total_seconds() < 0.01
    before = time.monotonic() - mono  # now() reads the monotonic clock in between: however long that takes
    elapsed = (clock.now() - base).total_seconds() - 0.7 - 0.005
    after = time.monotonic() - mono
    assert before - 0.002 <= elapsed <= after + 0.002  # to the millisecond BSON keeps
    clock._take(mono - 1.0, mono, {"localTime": base + dt.timedelta(seconds=0.4)})  # a slower one cannot widen it
    assert clock.error().total_seconds() < 0.01
    assert clock.earliest() < clock.now() < clock.latest()
    clock._take(mono - 0.01, mono, {"localTime": base + dt.timedelta(hours=1)})  # the server's clock was stepped
    assert (clock.now() - base).total_seconds() > 3599 and clock.error().total_seconds() < 0.01


def test_a_clock_never_reads_earlier_than_it_did_unless_the_server_clock_was_stepped_back():
    from bucketq.shell.clock import ServerClock

    clock = ServerClock()
    mono = time.monotonic()
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    clock._take(mono - 0.02, mono, {"localTime": base})  # +-11 ms
    first = clock.now()
    # A resync within the error that puts the estimate 5 ms back: what was already read stays the floor,
    # so a due time written at the first reading is never in the future for the next one.
    clock._take(mono - 0.002, mono, {"localTime": first - dt.timedelta(milliseconds=5)})
    assert clock.now() >= first
    clock._take(mono - 0.002, mono, {"localTime": base - dt.timedelta(hours=1)})  # stepped back: followed
    assert (base - clock.now()).total_seconds() > 3590


async def test_stats_count_a_message_pushed_by_a_clock_ahead_of_this_ones_as_ready():
    from bucketq.memory import MemoryDatabase

    async with bucketq.Queue(MemoryDatabase(), name="skew", **QUICK) as producer:
        await producer.push("x")
        async with bucketq.Queue(producer.database, name="skew", **QUICK) as reader:
            await reader.stats()  # synced
            # A reading a second behind the producer's, within its error of two (a sync on a loaded host)
            clock = reader._clock
            clock._anchor(clock._server_s - 1.0, clock._mono_s, 2.0)
            clock._last = (-1, clock._last[1])
            assert (await reader.stats())["ready"] == 1


async def test_a_message_pushed_by_a_clock_ahead_within_its_error_is_due_at_once_for_an_exact_one():
    from bucketq.memory import MemoryDatabase

    database = MemoryDatabase()
    async with bucketq.Queue(database, name="skew", **QUICK) as producer, \
            bucketq.Queue(database, name="skew", **QUICK) as reader:
        await asyncio.gather(producer.stats(), reader.stats())  # both synced
        # The producer's reading a second ahead, within its error of two (its sync's request was held up)
        ahead, exact = producer._clock, reader._clock
        ahead._anchor(ahead._server_s + 1.0, ahead._mono_s, 2.0)
        exact._anchor(exact._server_s, exact._mono_s, 0.0)
        await producer.push("x")
        assert (await reader.stats())["ready"] == 1
        message = await reader.reserve(timeout=0)
        assert message is not None and message.payload == "x"
        await message.ack()


def test_a_clock_reading_with_a_large_error_is_refined_sooner_than_a_good_one_is_renewed():
    from bucketq.shell.clock import REFINE_EVERY_S, RESYNC_EVERY_S, ServerClock

    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    good, rough = ServerClock(), ServerClock()
    assert good.stale and rough.stale  # never synced
    mono = time.monotonic()
    good._take(mono - 0.002, mono, {"localTime": base})  # +-2 ms
    rough._take(mono - 1.0, mono, {"localTime": base})  # +-0.5 s: a sync made while something was busy
    assert not good.stale and not rough.stale
    for clock in (good, rough):
        assert clock._synced_at is not None
        clock._synced_at -= REFINE_EVERY_S + 1
    assert not good.stale and rough.stale
    assert good._synced_at is not None
    good._synced_at -= RESYNC_EVERY_S
    assert good.stale


def test_clock_latest_is_never_earlier_than_the_reading_plus_its_error():
    """``latest()`` keeps one datetime a millisecond: it must round up, or a holder would serve up to a
    millisecond past what its lease allows."""
    from bucketq.shell.clock import ServerClock

    clock = ServerClock()
    mono = time.monotonic()
    # an error with half a millisecond in it: rounding (a+e) down, or a down and e after, falls short half the time
    clock._take(mono - 0.001, mono, {"localTime": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
    for _ in range(200):
        exact = clock.now() + clock.error()  # now() is already down to the millisecond: at most the exact reading
        assert clock.latest() >= exact
        time.sleep(0.0001)


# -- 11. one slow write does not starve the other leases ------------------------------------------------------

async def test_a_slow_write_on_one_bucket_does_not_let_the_other_leases_expire(make_queue, memory_db):
    options = {**QUICK, "lease": 1.5, "state_flush_period": 0.1, "bucket_max_size": 1}
    a, c = make_queue(**options), make_queue(**options)
    await a.push_many(["x", "y"])
    x = await a.reserve(timeout=5)
    y = await a.reserve(timeout=5)
    released = asyncio.Event()
    # A's writes on x are held back: retrying through a server restart, for longer than the lease
    slow = memory_db.faults.delay("update_one", collection="events", until=released, times=1000, where=_by(x))
    try:
        await asyncio.sleep(2.5)
        taken = [m.payload for m in [await c.reserve(timeout=0.3), await c.reserve(timeout=0.3)] if m]
        assert slow.hits >= 1, "x's writes were not held back"
        assert "y" not in taken, "y's lease expired while x's write was slow"
        await y.ack(wait=True)
    finally:
        released.set()


# -- 12. resolving one's own message in a Worker, and after a drain ------------------------------------------

async def test_a_worker_handler_may_ack_or_nack_its_own_message(make_queue):
    q = make_queue(**QUICK)
    await q.push_many([{"i": i} for i in range(6)])
    seen: list[tuple[int, int]] = []

    async def handler(message: bucketq.Message) -> None:
        seen.append((message.payload["i"], message.tries))
        if message.payload["i"] % 2 and message.tries == 0:
            await message.nack(delay=0)
        else:
            await message.ack()
        if len(seen) == 9:
            worker.stop()

    worker = bucketq.Worker(q, handler, concurrency=2, handle_signals=False)
    await asyncio.wait_for(worker.run(), 20)
    assert sorted(seen) == sorted([(i, 0) for i in range(6)] + [(1, 1), (3, 1), (5, 1)])
    assert worker.failed == 0


async def test_an_ack_after_drain_gave_the_message_back_raises_lease_lost(make_queue):
    q = make_queue(**QUICK)
    await q.push("slow")
    message = await q.reserve(timeout=5)
    await q.drain()  # drain_timeout 0: the handler is still running
    with pytest.raises(bucketq.LeaseLost):
        await message.ack()


# -- 13. credentials never appear in errors ---------------------------------------------------------------------

@pytest.mark.parametrize("uri", ["mongodb://user:s3cret-pw@host:notaport/db", "mongodb://user:s3cret-pw@/db",
                                 "mongodb://user:s3cret-pw@h/db?authMechanism=NOPE",
                                 # reserved characters in the password, several hosts, srv
                                 "mongodb://user:s3cret/pw7@127.0.0.1:57321/shop",
                                 "mongodb://user:s3cret/pw7@h1:1,h2:2/shop",
                                 "mongodb+srv://user:s3cret/pw7@cluster.example.invalid/shop",
                                 "mongodb://user:s3cret?pw7@127.0.0.1:57321/shop"])
def test_an_invalid_uri_error_does_not_show_the_password(uri):
    with pytest.raises(bucketq.InvalidOption) as caught:
        bucketq.Queue(uri, name="events")
    message = str(caught.value)
    assert message.startswith("invalid MongoDB URI mongodb") and "://***@" in message
    assert "s3cret" not in message and "pw7" not in message and "user:" not in message  # the user name is hidden too


# -- tombstones are reaped after their retention --------------------------------------------------------------

async def test_tombstones_are_reaped_after_their_retention(make_queue, sync_db):
    q = make_queue(**QUICK, write_timeout=0.2, tombstone_retention=0.5)
    await q.push("m")
    message = await q.reserve(timeout=5)
    await no_background_housekeeping(q)  # its first round, slowed, could reap the tombstone during the sleep
    await message.ack(wait=True)
    assert sync_db.events.count_documents({"fin": {"$exists": True}}) == 1
    assert (await q.purge_expired())["tombstones"] == 0
    await asyncio.sleep(0.6)
    assert (await q.purge_expired())["tombstones"] == 1
    assert sync_db.events.count_documents({}) == 0

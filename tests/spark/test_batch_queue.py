"""``bucketq.batch.BatchQueue``, the driver side of the Spark batch cycle (no Spark): claims, tombstones,
quarantine, and fenced writes whose reply is lost (injected) and retried. On both backends: pymongo's
``MongoClient`` on the test server, and ``bucketq.memory``'s synchronous view (no JVM), through the same
generated synchronous store."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import pytest
from bson import ObjectId
from pymongo.errors import AutoReconnect

from bucketq.batch import BatchQueue
from bucketq.core import claims
from bucketq.core.backoff import Backoff
from bucketq.core.format import as_utc
from tests.helpers import PATIENCE_S, utc_now

pytestmark = pytest.mark.backends("memory", "server")

PAST = dt.datetime(2020, 1, 1)
NO_WAIT = Backoff(base=0.0, maximum=0.0, jitter=0.0)


async def _fill(make_queue, bq: BatchQueue, sync_db, n: int = 40, size: int = 10, **options) -> None:
    """Push ``n`` messages in buckets of ``size``; return once ``bq`` reads the server's clock past their ``due``.
    The producer set it by its own reading, and two clients' readings differ by up to their round trips' error: on
    a loaded machine a claim at once could find a bucket due a few milliseconds later, and take fewer."""
    q = make_queue(bucket_max_size=size, bucket_max_wait=0.02, **options)
    await q.push_many([{"i": i} for i in range(n)])
    await q.close()
    latest = max(as_utc(doc["due"]) for doc in sync_db.events.find({}, {"due": 1}))
    deadline = time.monotonic() + PATIENCE_S
    while bq.now() < latest:
        assert time.monotonic() < deadline, f"the batch queue's clock did not reach {latest} in {PATIENCE_S} s"
        time.sleep(0.005)


@pytest.fixture
def bq(queue_target, db_name):
    queue = BatchQueue(queue_target, name="events", db=db_name, lease=60, max_attempts=3, backoff=NO_WAIT)
    yield queue
    queue.close()


def _claim_released(bq: BatchQueue, n: int) -> Any:
    """Claim what a release without backoff just handed back. The release set ``due`` by one reading of the
    server's clock; a resync in between (a reading with a large error is refined soon) may put the claim's reading
    up to that error earlier, so the bucket can be due a millisecond later: wait for it rather than fail."""
    deadline = time.monotonic() + 5
    while (batch := bq.claim(n)) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return batch


def _expire_leases(sync_db) -> None:
    sync_db.events.update_many({"lease": {"$ne": None}}, {"$set": {"due": PAST, "lease.until": PAST}})


def _lose_first_reply(collection: Any, method: str, *, applied: bool = True,
                      meanwhile: Callable[[], Any] | None = None) -> list[int]:
    """Make the first call of ``collection.<method>`` lose its reply: it is applied (or not), ``meanwhile`` runs
    (another client acting before the retry), then it raises ``AutoReconnect``. Returns the list of calls."""
    real = getattr(collection, method)
    calls: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return real(*args, **kwargs)
        if applied:
            real(*args, **kwargs)
        if meanwhile is not None:
            meanwhile()
        raise AutoReconnect("connection closed (injected: the reply was lost)")

    setattr(collection, method, wrapper)
    return calls


def _raw_bucket(**fields: Any) -> dict:
    doc = {"_id": ObjectId(), "v": 1, "enc": "json", "created": PAST, "due": PAST, "n": 2, "p": ['{"i": 1}', "{bad"],
           "done": [], "c": 0, "lease": None}
    return {**doc, **fields}


async def test_claim_commit_and_fencing(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, bq, sync_db)
    batch = bq.claim(3)
    assert len(batch) == 3 and batch.messages == 30
    held = list(sync_db.events.find({"lease.token": batch.token}))
    assert sorted(d["_id"] for d in held) == sorted(batch.ids)
    assert all(d["c"] == 1 and d["lease"]["owner"] == bq.owner for d in held)

    rest = bq.claim(10)
    assert len(rest) == 1 and bq.claim(10) is None

    _expire_leases(sync_db)
    takeover = bq.claim(10)  # the three expired leases of `batch` and the one of `rest`
    assert len(takeover) == 4
    assert bq.commit(batch) == 0  # fenced: the old token finishes nothing
    assert bq.commit(takeover) == 4
    assert sync_db.events.count_documents(claims.LIVE) == 0
    tombstones = list(sync_db.events.find({"fin.token": takeover.token}))
    assert len(tombstones) == 4 and all("p" not in d and d["due"] == claims.TOMBSTONE_DUE.replace(tzinfo=None)
                                        for d in tombstones)
    assert bq.claim(10) is None  # tombstones are never claimed


async def test_release_backoff_then_quarantine_after_max_attempts(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, bq, sync_db, n=20)
    for attempt in (1, 2):
        batch = _claim_released(bq, 10)
        assert len(batch) == 2
        out = bq.release(batch, ValueError("boom"))
        assert sorted(out["released"]) == sorted(batch.ids) and out["quarantined"] == []
        docs = list(sync_db.events.find())
        assert all(d["lease"] is None and d["c"] == attempt for d in docs)  # tries + 1 per failed attempt

    # Third and last attempt: each bucket alone; the one claimed second is handed back untouched.
    first = _claim_released(bq, 10)
    assert len(first) == 1
    other = sync_db.events.find_one({"_id": {"$ne": first.ids[0]}})
    assert other["c"] == 2 and other["lease"] is None
    out = bq.release(first, ValueError("poison"))
    assert out == {"released": [], "quarantined": first.ids}
    entry = sync_db["events.quarantine"].find_one()
    assert entry["_id"] == first.ids[0] and entry["kind"] == "bucket"
    assert "failed 3 attempt(s)" in entry["reason"] and "ValueError: poison" in entry["reason"]
    assert entry["doc"]["p"] and "lease" not in entry["doc"]

    second = _claim_released(bq, 10)
    assert len(second) == 1 and bq.commit(second) == 1
    assert sync_db.events.count_documents(claims.LIVE) == 0
    assert sync_db.events.count_documents({"fin.token": first.token}) == 1  # quarantine left a tombstone too


async def test_a_batch_frees_the_keys_of_the_unique_jobs_it_commits_or_quarantines(make_queue, sync_db, bq) -> None:
    """A unique job finished by a batch (committed, or quarantined after its last attempt) frees its key, as the
    consumer's finish does: a later push of the key is a new job, not merged into one that is over."""
    q = make_queue(bucket_max_size=1, bucket_max_wait=0.02)
    committed = await q.push({"i": 1}, key="committed", unique_for=3600)
    poisoned = await q.push({"i": 2}, key="poisoned", unique_for=3600)
    keys = sync_db["events.unique"]
    batch = bq.claim(10)
    assert sorted(batch.ids) == sorted(ObjectId(i.split(":")[0]) for i in (committed, poisoned))
    first = next(d for d in batch.buckets if d["k"] == ["committed"])
    rest = bq.release(batch, ValueError("retry the other"))  # a retried job keeps its key
    assert sorted(rest["released"]) == sorted(batch.ids) and keys.count_documents({}) == 2
    batch = _claim_released(bq, 10)
    done = type(batch)(batch.token, batch.lease_until, [d for d in batch.buckets if d["_id"] == first["_id"]])
    assert bq.commit(done) == 1
    assert [d["_id"] for d in keys.find()] == ["poisoned"]
    poison = type(batch)(batch.token, batch.lease_until, [d for d in batch.buckets if d["_id"] != first["_id"]])
    bq.release(poison, ValueError("again"))
    assert bq.release(_claim_released(bq, 10), ValueError("for good"))["quarantined"]
    assert keys.count_documents({}) == 0
    assert await q.push({"i": 1}, key="committed", unique_for=3600) != committed
    assert await q.push({"i": 2}, key="poisoned", unique_for=3600) != poisoned


async def test_claim_quarantines_unreadable_and_expired_too_often(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, bq, sync_db, n=10)
    await _fill(make_queue, bq, sync_db, n=10, codec="msgpack")
    sync_db.events.insert_one({"_id": ObjectId(), "v": 99, "due": PAST})
    sync_db.events.update_one({"enc": "json"}, {"$set": {"c": 3}})  # three claims whose leases ran out

    batch = bq.claim(10)
    assert batch is not None and len(batch) == 0 and len(batch.quarantined) == 3
    reasons = sorted(e["reason"] for e in sync_db["events.quarantine"].find())
    assert any("codec 'msgpack'" in r for r in reasons)
    assert any("format version 99" in r for r in reasons)
    assert any("claimed 3 times without a commit or release" in r for r in reasons)
    assert sync_db.events.count_documents(claims.LIVE) == 0


async def test_claim_quarantines_a_bucket_with_a_non_numeric_claim_count(make_queue, sync_db, bq) -> None:
    bad = _raw_bucket(c="x")  # hand-edited: the claim's $inc fails on it
    sync_db.events.insert_one(bad)
    await _fill(make_queue, bq, sync_db, n=20)

    batch = bq.claim(10)

    assert batch.quarantined == [bad["_id"]] and len(batch) == 2
    entry = sync_db["events.quarantine"].find_one()
    assert entry["_id"] == bad["_id"] and entry["kind"] == "bucket" and entry["doc"]["c"] == "x"
    assert entry["reason"].startswith("cannot be claimed:") and "lease" not in entry["doc"]
    assert sync_db.events.find_one({"_id": bad["_id"]})["fin"]["token"] == batch.token
    assert bq.commit(batch) == 2 and bq.claim(10) is None


async def test_commit_retried_after_a_lost_reply_counts_its_own_tombstones(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, bq, sync_db, n=30)
    batch = bq.claim(10)
    calls = _lose_first_reply(bq.store.buckets, "bulk_write")

    assert bq.commit(batch) == 3  # the retry matches nothing: the tombstones say this token finished them
    assert len(calls) == 2
    assert all(sync_db.events.find_one(claims.finished_by(ref, batch.token)) for ref in batch.refs.values())


async def test_release_retried_after_a_lost_reply(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, bq, sync_db, n=20)
    batch = bq.claim(10)
    calls = _lose_first_reply(bq.store.buckets, "bulk_write")

    out = bq.release(batch, "boom")

    assert sorted(out["released"]) == sorted(batch.ids) and len(calls) == 2
    docs = list(sync_db.events.find())
    assert all(d["lease"] is None and d["c"] == 1 and d["released"] == batch.token for d in docs)


@pytest.mark.parametrize("step, others_write", [
    ("commit", lambda coll, i, now: coll.replace_one({"_id": i}, claims.finish(now, "other", 0))),
    ("release", lambda coll, i, now: coll.update_one({"_id": i}, claims.release(now, "other"))),
])
async def test_retry_after_a_lost_reply_does_not_count_someone_elses_write(make_queue, sync_db, bq, step,
                                                                           others_write) -> None:
    await _fill(make_queue, bq, sync_db, n=10)
    batch = bq.claim(10)
    (bucket_id,) = batch.ids

    def taken_over() -> None:  # the lease ran out; another job claimed the bucket and finished or released it
        others_write(sync_db.events, bucket_id, utc_now())

    calls = _lose_first_reply(bq.store.buckets, "bulk_write", applied=False, meanwhile=taken_over)
    applied = bq.commit(batch) if step == "commit" else len(bq.release(batch, "boom")["released"])
    assert applied == 0 and len(calls) == 2  # the bucket changed, but not by this batch's hand
    assert sync_db["events.quarantine"].count_documents({}) == 0


async def test_extend_retried_after_a_lost_reply_counts_what_is_still_held(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, bq, sync_db, n=20)
    batch = bq.claim(10)
    lost = batch.ids[0]

    def one_taken_over() -> None:
        sync_db.events.update_one({"_id": lost}, {"$set": {"lease.token": "other"}})

    calls = _lose_first_reply(bq.store.buckets, "bulk_write", meanwhile=one_taken_over)
    assert bq.extend(batch) == 1 and len(calls) == 2


async def test_commit_quarantines_malformed_messages_first_even_after_a_lost_reply(make_queue, sync_db,
                                                                                   bq) -> None:
    bucket = _raw_bucket(h=[None, {"src": "x"}], k=[None, "key-1"])
    sync_db.events.insert_one(bucket)
    batch = bq.claim(10)
    batch.malformed[(bucket["_id"], 1)] = "does not parse"
    calls = _lose_first_reply(bq.store.quarantine, "insert_many")

    assert bq.commit(batch) == 1 and len(calls) == 2  # the retried insert finds its entry there: no error
    (entry,) = sync_db["events.quarantine"].find()
    assert entry["_id"] == f"{bucket['_id']}:1" and entry["kind"] == "message" and entry["reason"] == "does not parse"
    assert (entry["p"], entry["enc"], entry["h"], entry["k"]) == ("{bad", "json", {"src": "x"}, "key-1")
    assert entry["origin"] == {"bucket": bucket["_id"], "slot": 1} and entry["pid"] > 0 and entry["host"]
    assert sync_db.events.find_one({"_id": bucket["_id"]})["fin"]["token"] == batch.token


async def test_commit_that_cannot_quarantine_finishes_nothing(make_queue, sync_db, bq) -> None:
    bucket = _raw_bucket()
    sync_db.events.insert_one(bucket)
    batch = bq.claim(10)
    batch.malformed[(bucket["_id"], 1)] = "does not parse"

    def refused(*args: Any, **kwargs: Any) -> None:
        raise PermissionError("insert refused (injected)")

    bq.store.quarantine.insert_many = refused
    with pytest.raises(PermissionError):
        bq.commit(batch)
    assert sync_db.events.find_one({"_id": bucket["_id"]})["lease"]["token"] == batch.token  # still held, intact


@pytest.mark.parametrize("step", ["commit of a malformed message", "release after the last attempt"])
async def test_a_stale_claimant_does_not_quarantine_a_bucket_another_claimant_holds(sync_db, bq, queue_target,
                                                                                   db_name, step) -> None:
    """A batch's lease runs out and another job claims its bucket; the stale batch then commits (quarantining a
    message it could not decode) or releases (its last attempt: the bucket to quarantine). Its fenced guard
    (``claims.guard``, as the consumer's) is refused: nothing is copied to quarantine, the other job keeps it."""
    bucket = _raw_bucket(c=2 if step.startswith("release") else 0)  # the stale claim is the last of 3 attempts
    sync_db.events.insert_one(bucket)
    stale = bq.claim(10)
    assert stale.ids == [bucket["_id"]]
    _expire_leases(sync_db)
    with BatchQueue(queue_target, name="events", db=db_name, lease=60, max_attempts=5) as other:
        current = other.claim(10)
        assert current.ids == [bucket["_id"]]
    if step.startswith("commit"):
        stale.malformed[(bucket["_id"], 1)] = "does not parse"
        assert bq.commit(stale) == 0
    else:
        assert bq.release(stale, "boom") == {"released": [], "quarantined": []}
    assert sync_db["events.quarantine"].count_documents({}) == 0, "a stale claimant copied what another holds"
    assert sync_db.events.find_one({"_id": bucket["_id"]})["lease"]["token"] == current.token


def test_claims_reap_old_tombstones(queue_target, db_name, sync_db):
    sync_db.events.insert_many([
        {"_id": ObjectId(), "v": 1, "due": claims.TOMBSTONE_DUE, "lease": None,
         "fin": {"token": "t", "at": utc_now() - dt.timedelta(seconds=age)}}
        for age in (5, 3600)])
    with BatchQueue(queue_target, name="events", db=db_name, op_timeout_s=1, tombstone_retention=60) as bq:
        assert bq.claim(10) is None
    assert [d["fin"]["token"] for d in sync_db.events.find()] == ["t"], "the old tombstone is reaped, the new kept"


@pytest.mark.parametrize("kwargs", [{"name": "events.dead"}, {"name": "a..b"}, {"db": "a b"}, {"write_concern": 0},
                                    {"tombstone_retention": 1, "op_timeout_s": 30}])
def test_bad_names_and_options_are_invalid_option(queue_target, kwargs):
    import bucketq

    with pytest.raises(bucketq.InvalidOption):
        BatchQueue(queue_target, **{"name": "events", "db": "bq", **kwargs})


async def test_a_paused_queue_gives_batch_claims_nothing(make_queue, queue_target, db_name):
    async with make_queue(bucket_max_wait=0.005) as q:
        await q.push_many([1, 2, 3])
        await q.pause()
        with BatchQueue(queue_target, name="events", db=db_name) as bq:
            assert bq.claim(10) is None, "a batch job claimed from a paused queue"
            await q.resume()
            batch = bq.claim(10)
            assert batch is not None and batch.messages == 3
            bq.commit(batch)

"""``bucketq.batch.BatchQueue``, the driver side of the Spark batch cycle (pymongo only, no Spark)."""

from __future__ import annotations

import datetime as dt

import pytest
from bson import ObjectId

from bucketq.batch import BatchQueue
from bucketq.core.backoff import Backoff

PAST = dt.datetime(2020, 1, 1)
NO_WAIT = Backoff(base=0.0, maximum=0.0, jitter=0.0)


async def _fill(make_queue, n: int = 40, size: int = 10, **options) -> None:
    q = make_queue(bucket_max_size=size, bucket_max_wait=0.02, **options)
    await q.push_many([{"i": i} for i in range(n)])
    await q.close()


@pytest.fixture
def bq(mongo_uri, db_name):
    queue = BatchQueue(mongo_uri, name="events", db=db_name, lease=60, max_attempts=3, backoff=NO_WAIT)
    yield queue
    queue.close()


def _expire_leases(sync_db) -> None:
    sync_db.events.update_many({"lease": {"$ne": None}}, {"$set": {"due": PAST}})


async def test_claim_commit_and_fencing(make_queue, sync_db, bq) -> None:
    await _fill(make_queue)
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
    assert bq.commit(batch) == 0  # fenced: the old token deletes nothing
    assert bq.commit(takeover) == 4
    assert sync_db.events.count_documents({}) == 0


async def test_release_backoff_then_quarantine_after_max_attempts(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, n=20)
    for attempt in (1, 2):
        batch = bq.claim(10)
        assert len(batch) == 2
        out = bq.release(batch, ValueError("boom"))
        assert sorted(out["released"]) == sorted(batch.ids) and out["quarantined"] == []
        docs = list(sync_db.events.find())
        assert all(d["lease"] is None and d["c"] == attempt for d in docs)  # tries + 1 per failed attempt

    # Third and last attempt: each bucket alone; the one claimed second is handed back untouched.
    first = bq.claim(10)
    assert len(first) == 1
    other = sync_db.events.find_one({"_id": {"$ne": first.ids[0]}})
    assert other["c"] == 2 and other["lease"] is None
    out = bq.release(first, ValueError("poison"))
    assert out == {"released": [], "quarantined": first.ids}
    entry = sync_db["events.quarantine"].find_one()
    assert entry["_id"] == first.ids[0] and entry["kind"] == "bucket"
    assert "failed 3 attempt(s)" in entry["reason"] and "ValueError: poison" in entry["reason"]
    assert entry["doc"]["p"] and "lease" not in entry["doc"]

    second = bq.claim(10)
    assert len(second) == 1 and bq.commit(second) == 1
    assert sync_db.events.count_documents({}) == 0


async def test_claim_quarantines_unreadable_and_expired_too_often(make_queue, sync_db, bq) -> None:
    await _fill(make_queue, n=10)
    await _fill(make_queue, n=10, codec="msgpack")
    sync_db.events.insert_one({"_id": ObjectId(), "v": 99, "due": PAST})
    sync_db.events.update_one({"enc": "json"}, {"$set": {"c": 3}})  # three claims whose leases ran out

    batch = bq.claim(10)
    assert batch is not None and len(batch) == 0 and len(batch.quarantined) == 3
    reasons = sorted(e["reason"] for e in sync_db["events.quarantine"].find())
    assert any("codec 'msgpack'" in r for r in reasons)
    assert any("format version 99" in r for r in reasons)
    assert any("claimed 3 times without a commit or release" in r for r in reasons)
    assert sync_db.events.count_documents({}) == 0

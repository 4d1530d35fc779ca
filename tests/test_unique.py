"""Unique jobs (``push(key=..., unique_for=...)``) over a real connection: a second push of a key while its job is
pending or in flight merges into it, across producers and processes; the key frees when the job is finished or
``unique_for`` has passed; a lost reply on the key's insert or takeover, and a producer that stops between the key
and its bucket, still leave exactly one job. The expiry is the producer's clock, moved by the test: no test waits
for ``unique_for`` to pass."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from pymongo.errors import OperationFailure

import bucketq
from bucketq import Outgoing
from tests.format_checks import check, check_bucket
from tests.helpers import drained, lossy_queue, race_processes

pytestmark = pytest.mark.backends("memory", "server")

QUICK = {"poll_interval": 0.01, "state_flush_period": 0.02}
HOUR = 3600


def later(q: bucketq.Queue, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move ``q``'s clock ``seconds`` on (as if that long had passed for its producer)."""
    now = q._clock.now
    monkeypatch.setattr(q._clock, "now", lambda: now() + dt.timedelta(seconds=seconds))


async def test_a_second_push_of_a_key_while_its_job_is_pending_merges_into_it(make_queue, sync_db):
    q = make_queue("jobs", **QUICK)
    first = await q.push({"report": 7}, key="report:7", unique_for=HOUR)
    assert await q.push({"report": 7, "again": True}, key="report:7", unique_for=HOUR) == first
    # in one write: the merged slot is stored done, and its push resolves to the first job's id
    burst = [q.push_nowait({"n": i}, key="burst", unique_for=HOUR) for i in range(3)]
    burst_ids = await asyncio.gather(*burst)
    assert len(set(burst_ids)) == 1
    many = await q.push_many([Outgoing({"report": 7}, key="report:7", unique_for=HOUR), {"plain": 1},
                              Outgoing({"other": 1}, key="other", unique_for=HOUR)])
    assert many[0] == first and len(set(many)) == 3
    keyed = await q.push({"same key, not unique": 1}, key="report:7")
    assert keyed != first  # key= alone never merges
    for doc in sync_db.jobs.find():
        check_bucket(doc)
    for doc in sync_db["jobs.unique"].find():
        check(doc, "unique-fields")
    messages = await drained(q)
    assert sorted(m.id for m in messages) == sorted({first, burst_ids[0], many[1], many[2], keyed})
    assert [m.payload for m in messages if m.id == first] == [{"report": 7}]
    assert sync_db["jobs.unique"].count_documents({}) == 0  # every key freed by its ack


async def test_the_key_is_held_while_in_flight_and_retried_and_freed_when_the_job_is_finished(make_queue, sync_db):
    q = make_queue("jobs", **QUICK)
    first = await q.push("job", key="k", unique_for=HOUR)
    message = await q.reserve(timeout=5)
    assert message is not None and message.id == first
    assert await q.push("job", key="k", unique_for=HOUR) == first  # in flight
    await message.nack(0, wait=True)
    assert await q.push("job", key="k", unique_for=HOUR) == first  # its retry holds the key on, under its id
    retried = await q.reserve(timeout=5)
    assert retried is not None and retried.id == first
    await retried.ack(wait=True)
    second = await q.push("job", key="k", unique_for=HOUR)
    assert second != first  # acked: the key is free again
    dead = await q.reserve(timeout=5)
    assert dead is not None and dead.id == second
    await dead.dead_letter(wait=True)
    assert await q.push("job", key="k", unique_for=HOUR) not in (first, second)  # a dead letter frees it too


async def test_delayed_and_grouped_unique_jobs_merge_too(make_queue):
    q = make_queue("jobs", **QUICK)
    grouped = await q.push("g", key="g", group="account-1", unique_for=HOUR)
    ids = await asyncio.gather(q.push("g", key="g", group="account-1", unique_for=HOUR),
                               q.push("after", group="account-1"))
    assert ids[0] == grouped and ids[1] != grouped
    delayed = await q.push("d", key="d", delay=0.05, unique_for=HOUR)
    assert await q.push("d", key="d", unique_for=HOUR) == delayed
    messages = await drained(q)
    assert sorted(m.payload for m in messages) == ["after", "d", "g"]
    assert [m.id for m in messages if m.payload != "d"] == [grouped, ids[1]]  # the group's order


async def test_a_purge_frees_the_keys_of_the_jobs_it_deletes(make_queue, sync_db):
    q = make_queue("jobs", **QUICK)
    first = await q.push("job", key="k", unique_for=HOUR)
    held = await q.push("other", key="held", unique_for=HOUR)
    message = await q.reserve(timeout=5)
    assert message is not None and message.id == first
    await message.nack(0, wait=True)  # its retry copy holds the key under the same id
    assert await q.purge() == 2
    assert sync_db["jobs.unique"].count_documents({}) == 0
    assert await q.push("job", key="k", unique_for=HOUR) != first
    assert await q.push("other", key="held", unique_for=HOUR) != held


async def test_a_removed_unique_job_frees_its_key(make_queue, sync_db):
    q = make_queue("jobs", **QUICK)
    first = await q.push("job", key="k", unique_for=HOUR)
    kept = await q.push("other", key="kept", unique_for=HOUR)
    assert await q.remove(first)
    assert [d["_id"] for d in sync_db["jobs.unique"].find()] == ["kept"]
    again = await q.push("job", key="k", unique_for=HOUR)
    assert again != first  # a new job, not merged into the removed one
    assert await q.push("other", key="kept", unique_for=HOUR) == kept
    assert sorted(m.id for m in await drained(q, want=2)) == sorted([kept, again])


async def test_a_key_frees_once_unique_for_has_passed(make_queue, monkeypatch):
    q = make_queue("jobs", **QUICK)
    first = await q.push("job", key="k", unique_for=60)
    later(q, monkeypatch, 30)
    assert await q.push("job", key="k", unique_for=60) == first
    later(q, monkeypatch, 31)  # 61 s after the first push: its hold expired, this push takes the key over
    second = await q.push("job", key="k", unique_for=60)
    assert second != first
    assert await q.push("job", key="k", unique_for=60) == second
    assert {m.id for m in await drained(q, want=2)} == {first, second}


async def test_producers_racing_to_take_over_expired_keys_make_one_job_per_key(make_queue, monkeypatch):
    """The takeover of an expired key is conditional: the producers that lose it read the key again and merge."""
    first = make_queue("jobs", **QUICK)
    keys = [f"k{i}" for i in range(20)]
    old = set(await asyncio.gather(*(first.push(k, key=k, unique_for=60) for k in keys)))
    producers = [make_queue("jobs", **QUICK) for _ in range(3)]
    for q in producers:
        later(q, monkeypatch, 61)
    ids = await asyncio.gather(*(q.push(k, key=k, unique_for=60) for k in keys for q in producers))
    by_key = [set(ids[i * 3:i * 3 + 3]) for i in range(len(keys))]
    assert all(len(found) == 1 for found in by_key), by_key
    new = {found.pop() for found in by_key}
    assert not new & old
    # by its clock: the new ones are due
    assert {m.id for m in await drained(producers[0], want=len(old | new))} == old | new


async def test_two_producers_racing_over_the_same_keys_make_one_job_per_key(make_queue, sync_db):
    producers = [make_queue("jobs", **QUICK) for _ in range(3)]
    keys = [f"k{i}" for i in range(40)]
    pushes = [q.push({"key": k, "by": n}, key=k, unique_for=HOUR) for k in keys for n, q in enumerate(producers)]
    ids = await asyncio.gather(*pushes)
    by_key: dict[str, set[str]] = {}
    for (k, _), message_id in zip([(k, n) for k in keys for n in range(3)], ids, strict=True):
        by_key.setdefault(k, set()).add(message_id)
    assert all(len(found) == 1 for found in by_key.values()), by_key
    messages = await drained(producers[0])
    assert sorted(m.payload["key"] for m in messages) == sorted(keys)
    assert {m.id for m in messages} == {found.pop() for found in by_key.values()}


async def test_producer_processes_racing_make_one_job_per_key(mongo_uri, db_name, sync_db, make_queue):
    """Three processes (``tests/entrypoints/unique_proc.py``) push the same 50 unique keys at once: every key gets
    one job, and every process's push of a key returned that job's id."""
    count = 50
    outputs = race_processes("tests.entrypoints.unique_proc", [mongo_uri, db_name, str(count)], sync_db.barrier)
    by_process = [json.loads(out) for out in outputs]
    assert all(ids == by_process[0] for ids in by_process), by_process
    messages = await drained(make_queue("jobs", **QUICK))
    assert {m.id: m.payload["key"] for m in messages} == {i: int(k) for k, i in by_process[0].items()}


async def test_a_lost_reply_on_the_key_insert_leaves_one_job_and_the_push_resolves_to_it(backend, make_queue,
                                                                                        request, sync_db):
    q, lose_reply = lossy_queue(backend, make_queue, request, "jobs", **QUICK)
    await q.stats()  # set up first: the fault is for the key's insert
    lost = lose_reply("insert", "jobs.unique")
    first = await q.push("job", key="k", unique_for=HOUR)
    assert lost.hits == 1
    assert sync_db["jobs.unique"].find_one({"_id": "k"})["m"] == first  # the retry found its own key
    assert await make_queue("jobs", **QUICK).push("job", key="k", unique_for=HOUR) == first
    assert [m.id for m in await drained(q, want=1)] == [first]


async def test_a_lost_reply_on_the_takeover_of_an_expired_key_leaves_one_job(backend, make_queue, request,
                                                                            monkeypatch, sync_db):
    q, lose_reply = lossy_queue(backend, make_queue, request, "jobs", **QUICK)
    first = await q.push("job", key="k", unique_for=60)
    later(q, monkeypatch, 61)
    lost = lose_reply("update", "jobs.unique")
    second = await q.push("job", key="k", unique_for=60)
    assert lost.hits == 1 and second != first
    assert sync_db["jobs.unique"].find_one({"_id": "k"})["m"] == second
    assert await q.push("job", key="k", unique_for=60) == second
    assert {m.id for m in await drained(q, want=2)} == {first, second}


async def test_a_producer_stopped_between_the_key_and_its_bucket_blocks_the_key_until_it_expires(
        make_queue, monkeypatch, sync_db):
    doomed, other = make_queue("jobs", **QUICK), make_queue("jobs", **QUICK)
    await doomed.stats()

    async def refused(docs: list[dict]) -> dict:
        raise OperationFailure("the producer stopped here", code=2)

    monkeypatch.setattr(doomed._store, "write_buckets", refused)
    with pytest.raises(bucketq.WriteFailed):
        await doomed.push("job", key="k", unique_for=60)
    holder = sync_db["jobs.unique"].find_one({"_id": "k"})["m"]
    # the key is held by a job that was never stored: pushes of it merge into nothing until it expires
    assert await other.push("job", key="k", unique_for=60) == holder
    assert await other.reserve(timeout=0.3) is None
    later(other, monkeypatch, 61)
    freed = await other.push("job", key="k", unique_for=60)
    assert freed != holder
    assert [m.id for m in await drained(other)] == [freed]


@pytest.mark.parametrize("kwargs, says", [
    ({"unique_for": 60}, "needs a key"),
    ({"key": "k", "unique_for": 0}, "must be positive"),
    ({"key": "k", "unique_for": -1}, "delay must be"),
    ({"key": "k", "unique_for": True}, "delay must be"),
    ({"key": "k", "unique_for": float("nan")}, "delay must be"),
])
async def test_unique_for_is_validated_at_the_push(make_queue, kwargs, says):
    q = make_queue("jobs")
    with pytest.raises(bucketq.InvalidOption, match=says):
        await q.push("job", **kwargs)
    with pytest.raises(bucketq.InvalidOption, match=says):
        q.push_nowait("job", **kwargs)
    with pytest.raises(bucketq.InvalidOption, match=says):
        await q.push_many([Outgoing("job", **kwargs)])
    assert await q.push("job", key="k", unique_for=dt.timedelta(minutes=1))  # a timedelta is fine

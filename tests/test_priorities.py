"""Priorities (``push(priority=...)``) over a real connection: higher levels first, a bucket per level, the starvation
bound (``priority_fairness``), levels kept by retries, dead letters and requeues, bad input refused, a claim whose
reply was lost, and consumers racing (in one process, and two processes on the server)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import defaultdict

import pytest
from bson import ObjectId
from hypothesis import given
from hypothesis import strategies as st

import bucketq
from bucketq import InvalidOption, Outgoing
from bucketq.batch import BatchQueue
from bucketq.core.priorities import BY_AGE, BY_PRIORITY, Turns
from tests.helpers import PATIENCE_S, consume_all, seconds_ago, server_proxy, utc_now

pytestmark = pytest.mark.backends("memory", "server")

QUICK = {"bucket_max_wait": 0.005, "poll_interval": 0.02, "drain_timeout": 0}


def _bucket_of(message_id: str) -> ObjectId:
    return ObjectId(message_id.split(":")[0])


async def test_higher_levels_are_served_first_then_in_due_order_and_a_bucket_holds_one_level(make_queue, sync_db):
    q = make_queue(**QUICK, priority_fairness=0)
    await q.push("low-1")
    await q.push_many([Outgoing("mid-1", priority=5), "top-1", Outgoing("low-2", priority=0), "top-2"], priority=9)
    await q.push("mid-2", priority=5)
    for doc in sync_db.events.find():
        levels = {p.strip('"').split("-")[0] for p in doc["p"]}
        assert len(levels) == 1, f"a bucket holds one level: {doc['p']}"
        assert doc.get("pr") == {"top": 9, "mid": 5, "low": None}[levels.pop()], "pr is written only above 0"
    assert [m.payload for m in await consume_all(q, want=6)] == ["top-1", "top-2", "mid-1", "mid-2",
                                                                       "low-1", "low-2"]


@pytest.mark.parametrize("fairness", [3, 8])
async def test_every_nth_claim_takes_the_oldest_due_bucket_so_a_backlog_of_higher_levels_starves_no_one(
        make_queue, sync_db, fairness):
    """The starvation bound (README, Priorities): of any N buckets one consumer takes in a row, one at least is the
    oldest due one whatever its level; without fairness (0) the old low bucket waits for the whole backlog."""
    strict, fair = make_queue(**QUICK, bucket_max_size=1, priority_fairness=0), \
        make_queue(**QUICK, bucket_max_size=1, priority_fairness=fairness)
    for q in (strict, fair):
        old = await q.push("old")
        sync_db.events.update_one({"_id": _bucket_of(old)}, {"$set": {"due": seconds_ago(60)}})  # the oldest due bucket
        await q.push_many([{"i": i} for i in range(2 * fairness)], priority=9)
        got = [m.payload for m in await consume_all(q, want=1 + 2 * fairness)]
        assert sorted(got, key=str) == sorted(["old", *({"i": i} for i in range(2 * fairness))], key=str)
        expected = len(got) - 1 if q is strict else fairness - 1  # the N-th claim goes by age
        assert got.index("old") == expected, got


async def test_retries_dead_letters_and_requeues_keep_the_level(make_queue, sync_db):
    q = make_queue(**QUICK, max_attempts=2, priority_fairness=0)
    await q.push("urgent", priority=7)
    first = await q.reserve(timeout=2)
    await first.nack(delay=0, error="again", wait=True)
    (retry,) = [d for d in sync_db.events.find({"pt": 0}) if d.get("o") == [first.id]]
    assert retry["pr"] == 7
    await q.push("plain")
    second = await q.reserve(timeout=2)
    assert (second.payload, second.tries) == ("urgent", 1), "the retry keeps its level: before the plain one"
    await second.nack(error="for good", wait=True)
    (dead,) = list(sync_db["events.dead"].find())
    assert dead["pr"] == 7
    assert await q.requeue_dead() == 1
    (requeued,) = [d for d in sync_db.events.find({"pt": 0}) if d.get("o") == [first.id] and "fin" not in d]
    assert requeued["pr"] == 7
    assert sorted(m.payload for m in await consume_all(q, want=2)) == ["plain", "urgent"]


async def test_peek_and_stats_show_the_levels(make_queue, sync_db):
    q = make_queue(**QUICK)
    await q.push_many(["low-1", "low-2"])
    await q.push_many(["top-1", "top-2", "top-3"], priority=9)
    await q.push("mid-1", priority=5)
    await q.push("later", priority=5, delay=3600)
    peeked = {m["payload"]: m["priority"] for m in await q.peek(10)}
    assert peeked == {"low-1": 0, "low-2": 0, "top-1": 9, "top-2": 9, "top-3": 9, "mid-1": 5, "later": 5}
    stats = await q.stats()
    assert stats["ready_by_priority"] == {9: 3, 5: 1, 0: 2} and list(stats["ready_by_priority"]) == [9, 5, 0]
    assert (stats["ready"], stats["scheduled"]) == (6, 1)
    sync_db.events.update_one({"pr": 5, "due": {"$lte": utc_now()}}, {"$set": {"pr": "high"}})  # not a level: as 0
    assert (await q.stats())["ready_by_priority"] == {9: 3, 0: 3}
    await consume_all(q, want=5)  # the bucket whose pr is not a level goes to quarantine
    assert (await q.stats())["ready_by_priority"] == {}


async def test_bad_priorities_are_refused_and_bad_stored_levels_go_to_quarantine(make_queue, sync_db):
    q = make_queue(**QUICK)
    for bad in (10, -1, True, 1.5, 0.0, False, "1", None):  # 0.0, False and None are falsy: no level 0 for them
        with pytest.raises(InvalidOption, match="priority must be an int from 0 to 9"):
            await q.push("x", priority=bad)
        with pytest.raises(InvalidOption, match="priority must be an int from 0 to 9"):
            q.push_nowait("x", priority=bad)
        with pytest.raises(InvalidOption, match="payload 0: priority"):
            await q.push_many(["x"], priority=bad)
        if bad is not None:  # an Outgoing's None: the call's priority
            with pytest.raises(InvalidOption, match="payload 1: priority"):
                await q.push_many(["ok", Outgoing("x", priority=bad)])
    with pytest.raises(InvalidOption, match="grouped message takes no priority"):
        q.push_nowait("x", group="g", priority=1)
    with pytest.raises(InvalidOption, match="priority_fairness"):
        make_queue(priority_fairness=-1)
    with pytest.raises(InvalidOption, match="priority_fairness"):
        make_queue(priority_fairness=True)
    assert sync_db.events.count_documents({}) == 0, "nothing was pushed"
    await q.push_many([Outgoing("g", group="g"), "plain"])  # a group's items take level 0, not the call's
    assert sync_db.events.count_documents({"pr": {"$exists": True}}) == 0
    now = utc_now()
    for bad in ("9", 10, -1, 1.5):
        sync_db.events.insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": now, "due": now, "n": 1,
                                   "p": ["1"], "done": [], "c": 0, "lease": None, "pr": bad})
    sync_db.events.update_one({"g": "g"}, {"$set": {"pr": 3}})
    assert sorted(m.payload for m in await consume_all(q, want=1)) == ["plain"]  # the rest quarantined
    reasons = [e["reason"] for e in sync_db["events.quarantine"].find()]
    assert len(reasons) == 5 and sum("pr must be an integer from 0 to 9" in r for r in reasons) == 4
    assert sum("group bucket (field g) has no priority" in r for r in reasons) == 1


async def test_a_claim_whose_reply_was_lost_serves_the_next_level_and_its_bucket_comes_back_after_the_lease(
        backend, make_queue, request):
    proxy = None
    if backend == "server":
        proxy = server_proxy(request, make_queue)
    q = make_queue(target=proxy and proxy.uri, **QUICK, lease=1.0, state_flush_period=0.2, change_streams=False,
                   priority_fairness=0)
    await q.push("low")
    await q.push("high", priority=3)
    if proxy is None:
        lost = request.getfixturevalue("memory_db").faults.lose_reply("findAndModify", collection="events")
    else:
        lost = proxy.lose_reply("findAndModify", collection="events")
    first = await q.reserve(timeout=5)
    assert lost.hits == 1
    assert (first.payload, first.tries) == ("low", 0), "the lost claim holds the high bucket until its lease ends"
    await first.ack(wait=True)
    second = await q.reserve(timeout=5)
    assert (second.payload, second.tries) == ("high", 1), "the lost claim counts as a try"
    await second.ack(wait=True)
    assert await q.reserve(timeout=0.3) is None


async def test_consumers_racing_over_levels_never_hold_one_bucket_at_once(make_queue, sync_db):
    producer = make_queue(**QUICK, bucket_max_size=3)
    await producer.push_many([Outgoing({"i": i}, priority=i % 10) for i in range(120)])
    consumers = [make_queue(**QUICK, priority_fairness=f) for f in (0, 2, 8)]
    held: set[str] = set()
    handled: dict[int, int] = defaultdict(int)

    async def run(q: bucketq.Queue) -> None:
        while len(handled) < 120:  # a reserve that found nothing tries again: a starved one may time out early
            if (m := await q.reserve(timeout=0.5)) is None:
                continue
            assert m.id not in held, f"{m.id} served by two consumers at once"
            held.add(m.id)
            await asyncio.sleep(0)
            handled[m.payload["i"]] += 1
            held.discard(m.id)
            await m.ack()

    await asyncio.wait_for(asyncio.gather(*(run(q) for q in consumers)), PATIENCE_S)
    assert sorted(handled) == list(range(120)) and set(handled.values()) == {1}


async def test_batch_claims_honour_priorities_and_fairness(make_queue, sync_db, queue_target, db_name):
    """``BatchQueue`` (the Spark driver's) claims as consumers do: by level, every N-th bucket by age."""
    q = make_queue(**QUICK)
    for i, level in enumerate([0, 2, 9, 9, 9]):  # each older than the next
        pushed = await q.push(level, priority=level)
        sync_db.events.update_one({"_id": _bucket_of(pushed)}, {"$set": {"due": seconds_ago(60 - i)}})
    bq = BatchQueue(queue_target, name="events", db=db_name, priority_fairness=3)
    batch = bq.claim(max_buckets=5)
    assert batch is not None and [d["p"][0] for d in batch.buckets] == ["9", "9", "0", "9", "2"]
    with pytest.raises(InvalidOption, match="priority_fairness"):
        BatchQueue(queue_target, name="events", db=db_name, priority_fairness=1001)


@pytest.mark.backends("memory")
async def test_each_claim_order_is_the_order_of_an_index(make_queue, sync_db):
    """Claims by priority and by age both walk an index in order (in a partition): no sort in memory on a real
    MongoDB, whose ``notablescan`` would not refuse one (the ``pt`` prefix bounds it)."""
    await make_queue().push("x")
    keys = [list(map(tuple, i["key"])) for i in sync_db.events.index_information().values()]
    for sort in (BY_PRIORITY, BY_AGE):
        assert [("pt", 1), *sort] in keys


@given(st.integers(0, 12), st.lists(st.booleans(), max_size=60))
def test_of_any_n_buckets_taken_in_a_row_one_is_taken_by_age(fairness, found):
    """``Turns``: a claim finds a bucket or not (``found``); of any ``fairness`` buckets taken in a row one at least
    was taken by age, and with ``fairness`` 0 none."""
    turns = Turns(fairness)
    taken: list[bool] = []  # whether each bucket taken was taken by age
    for hit in found:
        sort = turns.sort()
        if hit:
            turns.took(sort)
            taken.append(sort is BY_AGE)
    if fairness == 0:
        assert not any(taken)
    else:
        assert all(any(taken[i:i + fairness]) for i in range(len(taken) - fairness + 1))


@pytest.mark.backends("server")
@pytest.mark.timeout(150)
async def test_two_consumer_processes_racing_over_levels_handle_each_message_and_never_at_once(make_queue, sync_db,
                                                                                             mongo_uri, db_name):
    q = make_queue(**QUICK, bucket_max_size=5)
    await q.push_many([Outgoing({"i": i}, priority=i % 4) for i in range(300)])
    procs = [subprocess.Popen([sys.executable, "-m", "tests.entrypoints.consumer_proc", mongo_uri, db_name, "events"])
             for _ in range(2)]
    for proc in procs:
        assert await asyncio.to_thread(proc.wait, 120) == 0
    records = defaultdict(list)
    for r in sync_db.processed.find():
        records[r["i"]].append(r)
    assert sorted(records) == list(range(300)), "a message was never handled"
    assert len({r["pid"] for rs in records.values() for r in rs}) == 2, "one process took everything: no race"
    for i, rs in records.items():
        rs.sort(key=lambda r: r["start"])
        for a, b in zip(rs, rs[1:], strict=False):
            assert a["end"] <= b["start"] and b["tries"] >= 1, f"message {i} handled twice at once: {rs}"

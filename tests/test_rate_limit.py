"""A queue's rate limit (``QueueOptions.rate_limit``) over a real connection: consumers together serve at most the
limit per window of the server's clock, in one process and in several; the limit is stored with the queue (a
consumer with another is refused, one without adopts it); a lost reply wastes permits and never exceeds the limit;
``reserve_many`` takes what the window has left; a drain ends a wait for the next window."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import subprocess
import sys
from collections import Counter

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

import bucketq
from bucketq.cli import cli
from bucketq.core import rate_limit
from bucketq.core.rate_limit import RateLimit
from bucketq.core.sharding import LAYOUT
from bucketq.web import create_app
from tests.helpers import lossy_queue

pytestmark = pytest.mark.backends("memory", "server")

QUICK = {"poll_interval": 0.01, "state_flush_period": 0.02, "bucket_max_wait": 0.005}
HOUR = RateLimit(4, per=3600)  # one window for the whole test (a test that starts at the turn of an hour sees two)


async def served_until_empty(q: bucketq.Queue) -> list[bucketq.Message]:
    out = []
    while (m := await q.reserve(timeout=0)) is not None:
        out.append(m)
        await m.ack()
    return out


async def test_consumers_together_serve_at_most_the_limit_in_each_window(make_queue):
    limit = RateLimit(5, per=0.2)
    producer = make_queue(**QUICK)
    await producer.push_many(list(range(40)))
    consumers = [make_queue(rate_limit=limit, **QUICK) for _ in range(3)]
    windows: Counter[dt.datetime] = Counter()
    seen: list[int] = []

    all_seen = asyncio.Event()

    async def consume(q: bucketq.Queue) -> None:
        async for m in q.consume():
            windows[limit.window(q._clock.now())] += 1  # the window it was served in, by this consumer's clock
            seen.append(m.payload)
            await m.ack()
            if len(seen) == 40:
                all_seen.set()

    tasks = [asyncio.create_task(consume(q)) for q in consumers]
    # Until all are served, not until the consumers idle: when this test ended on an idle timeout, a late answer to an
    # ask ended the holder's consume early (fixed since: test_an_ask_answered_after_its_window_ended_...).
    await asyncio.wait_for(all_seen.wait(), 60)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(seen) == list(range(40))
    # A permit taken at the very end of a window can be spent just after it: one per consumer at most.
    assert max(windows.values()) <= limit.limit + len(consumers), windows
    assert len(windows) >= 40 // (limit.limit + len(consumers))


async def test_a_window_grants_exactly_its_limit_then_nothing_until_the_next(make_queue, sync_db):
    producer = make_queue(**QUICK)
    await producer.push_many(list(range(10)))
    a, b = make_queue(rate_limit=HOUR, **QUICK), make_queue(rate_limit=HOUR, **QUICK)
    served = await served_until_empty(a) + await served_until_empty(b)
    assert len(served) == HOUR.limit
    await asyncio.gather(a.close(), b.close())  # releasing what they hold: the rest waits for the next window
    sync_db["events.control"].update_one(LAYOUT, {"$unset": {"rate_limit": ""}})  # an operator lifts the limit
    rest = await served_until_empty(make_queue(**QUICK))  # and a consumer that names none takes the rest at once
    assert sorted(m.payload for m in served + rest) == list(range(10))


async def test_the_first_consumer_that_names_a_limit_stores_it_with_the_queue_and_another_is_refused(make_queue,
                                                                                                    sync_db):
    await make_queue(**QUICK).push_many(list(range(10)))  # the queue exists already, without a limit
    first = make_queue(rate_limit=HOUR, **QUICK)
    assert len(await served_until_empty(first)) == HOUR.limit
    assert sync_db["events.control"].find_one(LAYOUT) == {"_id": "layout", "partitions": 1,
                                                          "rate_limit": {"limit": 4, "per": 3600.0}}
    other = make_queue(rate_limit=RateLimit(8, per=3600), **QUICK)
    with pytest.raises(bucketq.InvalidOption, match=re.escape(
            "the queue's rate limit is RateLimit(4, per=3600), this consumer was opened with "
            "rate_limit=RateLimit(8, per=3600)")):
        await other.reserve(timeout=0)
    assert await make_queue(rate_limit=RateLimit(4, per=3600.0), **QUICK).reserve(timeout=0) is None  # spent
    adopting = make_queue(**QUICK)  # a consumer that names no limit counts against the queue's
    assert await served_until_empty(adopting) == []
    assert (await adopting.stats())["rate_limit"] == {"limit": 4, "per": 3600.0}


async def test_the_stored_limit_shows_in_stats_on_the_command_line_and_the_dashboard(make_queue, mongo_uri,
                                                                                     db_name):
    await make_queue(rate_limit=RateLimit(50, per=0.5)).push("x")  # stored at the queue's set-up

    def stats(*args: str) -> str:
        result = CliRunner().invoke(cli, ["stats", "events", *args, "--uri", mongo_uri, "--db", db_name])
        assert result.exit_code == 0, result.output
        return result.output

    assert "events: rate limit 50 per 0.5 s (stored with the queue)" in await asyncio.to_thread(stats)
    assert json.loads(await asyncio.to_thread(stats, "--json"))["rate_limit"] == {"limit": 50, "per": 0.5}
    def queue_page() -> str:  # on a thread: the dashboard's queues are made outside this test's event loop
        with TestClient(create_app(mongo_uri, db=db_name)) as client:
            return client.get("/queues/events").text

    assert "rate limit: 50 messages\n  per 0.5 s, stored with the queue" in await asyncio.to_thread(queue_page)


async def test_reserve_many_takes_what_the_window_has_left(make_queue):
    producer = make_queue(**QUICK)
    await producer.push_many(list(range(10)))
    q = make_queue(rate_limit=HOUR, **QUICK)
    first = await q.reserve(timeout=5)
    assert first is not None
    batch = await q.reserve_many(10, timeout=5)
    assert len(batch) == HOUR.limit - 1
    assert await q.reserve(timeout=0) is None
    for m in [first, *batch]:
        await m.ack()


async def test_a_lost_reply_on_an_ask_wastes_permits_and_never_exceeds_the_limit(backend, make_queue, request,
                                                                                 sync_db):
    producer = make_queue(**QUICK)
    await producer.push_many(list(range(10)))
    q, lose_reply = lossy_queue(backend, make_queue, request, rate_limit=HOUR, **QUICK)
    lost = lose_reply("findAndModify", "events.rate")
    served = await served_until_empty(q)
    assert lost.hits == 1
    assert len(served) == HOUR.limit - 1  # the retried ask of one permit was counted twice
    (window,) = sync_db["events.rate"].find()
    assert window["n"] > HOUR.limit


async def test_an_ask_answered_after_its_window_ended_waits_for_the_next_not_for_the_timeout(make_queue,
                                                                                             monkeypatch):
    """A window can end while the ask that finds it spent is answered (a slow round trip): the reserve then takes a
    permit of the next window. It used to take the window's end for its own deadline and return None at once, so
    that ``consume(idle_timeout=...)`` ended while the work was still there."""
    limit = RateLimit(1, per=1.0)
    producer = make_queue(**QUICK)
    await producer.push("job")
    q = make_queue(rate_limit=limit, **QUICK)
    store = q._consumer._permits._store
    ask = store.ask_permits
    late: list[dt.datetime] = []

    async def answered_after_the_window(window: dt.datetime, k: int) -> int:
        if late:
            return await ask(window, k)
        await ask(window, limit.limit)  # another consumer spent the window first
        counter = await ask(window, k)
        late.append(window)  # and the answer comes back once the window has ended
        await asyncio.sleep((limit.window_end(window) - q._clock.now()).total_seconds() + 0.01)
        return counter

    monkeypatch.setattr(store, "ask_permits", answered_after_the_window)
    message = await q.reserve(timeout=5)
    assert len(late) == 1
    assert message is not None and message.payload == "job"
    await message.ack()


async def test_a_drain_ends_a_wait_for_the_next_window(make_queue):
    producer = make_queue(**QUICK)
    await producer.push_many(list(range(HOUR.limit + 1)))
    q = make_queue(rate_limit=HOUR, **QUICK)
    await served_until_empty(q)
    waiting = asyncio.ensure_future(q.reserve())  # no timeout: waits for the next window, an hour away
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await q.drain()
    assert await asyncio.wait_for(waiting, 5) is None


async def test_old_windows_are_deleted_by_the_first_ask_of_a_new_one(make_queue, sync_db):
    limit = RateLimit(1000, per=0.05)
    producer = make_queue(**QUICK)
    await producer.push_many(list(range(5)))
    q = make_queue(rate_limit=limit, **QUICK)
    for _ in range(5):
        m = await q.reserve(timeout=5)
        assert m is not None
        await m.ack()
        window = limit.window(q._clock.now())
        while limit.window(q._clock.now()) == window:
            await asyncio.sleep(0.01)
    assert sync_db["events.rate"].count_documents({}) <= 2


@pytest.mark.backends("server")
def test_consumer_processes_together_serve_at_most_the_limit_in_each_window(mongo_uri, db_name, sync_db):
    limit = RateLimit(5, per=0.2)
    sync_db.events.drop()

    async def seed() -> None:
        async with bucketq.Queue(mongo_uri, name="events", db=db_name, **QUICK) as q:
            await q.push_many([{"i": i} for i in range(45)])

    asyncio.run(seed())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.entrypoints.consumer_proc", mongo_uri, db_name, "events",
                               "--rate-limit", f"{limit.limit}/{limit.per}"]) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    rows = list(sync_db.processed.find())
    assert sorted(r["i"] for r in rows) == list(range(45))
    # By each process's own reading of the server's clock (windows are): a message is served in its permit's
    # window, or just after it (a permit taken at the end of a window is spent after it: one per process at most).
    windows = Counter(limit.window(r["served"].replace(tzinfo=dt.timezone.utc)) for r in rows)
    assert max(windows.values()) <= limit.limit + len(procs), windows
    assert len(windows) >= 45 // (limit.limit + len(procs))


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "5", 2**31])
def test_a_bad_limit_is_refused(bad):
    with pytest.raises(bucketq.InvalidOption, match="rate limit"):
        RateLimit(bad)


@pytest.mark.parametrize("bad", [0, 0.001, -1, 86401, True, "1"])
def test_a_bad_window_is_refused(bad):
    with pytest.raises(bucketq.InvalidOption, match="per"):
        RateLimit(5, per=bad)


def test_a_queue_refuses_a_rate_limit_that_is_not_one():
    with pytest.raises(bucketq.InvalidOption, match="rate_limit must be a RateLimit"):
        bucketq.Queue(bucketq.memory.MemoryDatabase(), name="events", rate_limit=(5, 1))


@given(st.integers(1, 50), st.lists(st.tuples(st.integers(1, 20), st.booleans()), max_size=40))
def test_grants_never_exceed_the_limit_and_use_it_all_without_lost_replies(limit, asks):
    counter = granted = 0
    for k, lost_reply in asks:
        counter += k
        if lost_reply:  # applied, reply lost, asked again
            counter += k
        granted += rate_limit.granted(counter, k, limit)
    assert granted <= limit
    if not any(lost for _, lost in asks):
        assert granted == min(limit, sum(k for k, _ in asks))

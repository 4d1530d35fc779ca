"""Schedules (``bucketq.Schedule``) over a real connection: each tick enqueued once by schedulers racing, after a
lost reply, and after a scheduler stopped between its two writes; the missed-ticks policies after downtime; bad
input refused at construction. The clock is the test's (``run_once(now=...)``): no test waits for a tick."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import zoneinfo
from typing import Any

import pytest
from pymongo.errors import OperationFailure

import bucketq
from bucketq.core import schedule as schedule_core
from bucketq.core.schedule import tick_bucket_id
from bucketq.schedule import Schedule
from tests.helpers import drained, eventually, lossy_queue, race_processes

pytestmark = pytest.mark.backends("memory", "server")

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 5, 9, 0, 30, tzinfo=UTC)  # the schedules' first run: 30 s past a minute
EVERY_MINUTE = "* * * * *"
QUICK = {"poll_interval": 0.01, "state_flush_period": 0.02}


def minutes(n: int) -> dt.timedelta:
    return dt.timedelta(minutes=n)


def tick_ids(name: str, ticks: list[dt.datetime]) -> set[str]:
    """The ids of the messages a schedule enqueues for ``ticks``: slot 0 of each tick's bucket."""
    return {f"{tick_bucket_id('events', name, tick)}:0" for tick in ticks}


def every_minute(first: int, last: int) -> list[dt.datetime]:
    """The minute ticks after ``T0 + first`` minutes up to ``T0 + last`` minutes."""
    start = T0.replace(second=0)
    return [start + minutes(i) for i in range(first + 1, last + 1)]


async def test_two_schedulers_racing_over_many_ticks_enqueue_each_tick_exactly_once(make_queue):
    queues = [make_queue(**QUICK), make_queue(**QUICK)]  # two connections, as two processes have
    schedules = [Schedule(q, EVERY_MINUTE, {"job": "report"}, name="report") for q in queues]
    rng = random.Random(26)
    await asyncio.gather(*(s.run_once(now=T0) for s in schedules))
    enqueued: list[dt.datetime] = []
    for minute in range(1, 41):
        now = T0 + minutes(minute)
        # mostly both at once; now and then one of them misses a tick (busy, restarting)
        running = rng.choice([schedules, schedules, schedules[:1], schedules[1:]])
        for ticks in await asyncio.gather(*(s.run_once(now=now) for s in running)):
            enqueued += ticks
    assert sorted(enqueued) == every_minute(0, 40), "each tick enqueued by exactly one of the two"
    messages = await drained(queues[0], want=len(every_minute(0, 40)))
    assert {m.id for m in messages} == tick_ids("report", every_minute(0, 40))
    assert all(m.payload == {"job": "report"} for m in messages)
    assert {m.key for m in messages} == {schedule_core.tick_key("report", t) for t in every_minute(0, 40)}


async def test_scheduler_processes_racing_enqueue_each_tick_exactly_once(mongo_uri, db_name, sync_db):
    """Three processes (``tests/entrypoints/scheduler_proc.py``) run one schedule over the same 60 ticks at once:
    every tick is enqueued by exactly one of them, and the queue holds one bucket per tick."""
    count = 60
    outputs = race_processes("tests.entrypoints.scheduler_proc", [mongo_uri, db_name, str(count)], sync_db.barrier)
    by_process = [[dt.datetime.fromisoformat(t) for t in json.loads(out)] for out in outputs]
    assert sorted(t for ticks in by_process for t in ticks) == every_minute(0, count)
    assert {doc["_id"] for doc in sync_db.events.find({}, {"_id": 1})} == {
        tick_bucket_id("events", "race", t) for t in every_minute(0, count)}


async def test_the_first_run_enqueues_no_tick_from_before_it(make_queue):
    q = make_queue(**QUICK)
    schedule = Schedule(q, EVERY_MINUTE, "x", name="fresh")
    assert await schedule.run_once(now=T0) == []
    assert await schedule.run_once(now=T0 + dt.timedelta(seconds=20)) == []
    assert await schedule.run_once(now=T0 + dt.timedelta(seconds=40)) == [T0.replace(second=0) + minutes(1)]


@pytest.mark.parametrize("missed, expected", [("skip", every_minute(9, 10)),
                                              ("catch_up", every_minute(0, 10)),
                                              ("catch_up_limited", every_minute(6, 10))])
async def test_a_restart_after_downtime_follows_the_missed_ticks_policy(make_queue, missed, expected):
    q = make_queue(**QUICK)
    options: dict[str, Any] = {"missed": "catch_up", "catch_up_limit": 4} if missed == "catch_up_limited" \
        else {"missed": missed}
    await Schedule(q, EVERY_MINUTE, "x", name="nightly", **options).run_once(now=T0)
    # every scheduler down for ten minutes, then a new one starts
    restarted = Schedule(make_queue(**QUICK), EVERY_MINUTE, "x", name="nightly", **options)
    assert await restarted.run_once(now=T0 + minutes(10)) == expected
    assert await restarted.run_once(now=T0 + minutes(10)) == []
    assert {m.id for m in await drained(q, want=len(expected))} == tick_ids("nightly", expected)


@pytest.mark.parametrize("command, collection", [("insert", "events"), ("update", "events.control")])
async def test_a_lost_reply_on_the_insert_or_the_claim_enqueues_the_tick_once(backend, make_queue, request,
                                                                             command, collection):
    q, lose_reply = lossy_queue(backend, make_queue, request, **QUICK)
    schedule = Schedule(q, EVERY_MINUTE, "x", name="lossy")
    await schedule.run_once(now=T0)
    lost = lose_reply(command, collection)  # the tick's claim (update) or its bucket (insert)
    tick = every_minute(0, 1)
    assert await schedule.run_once(now=T0 + minutes(1)) == tick
    assert lost.hits == 1
    assert await Schedule(make_queue(**QUICK), EVERY_MINUTE, "x", name="lossy").run_once(now=T0 + minutes(1)) == []
    assert {m.id for m in await drained(q, want=len(tick))} == tick_ids("lossy", tick)


class Killed(BaseException):
    """A scheduler process killed at this point: nothing after it runs."""


@pytest.mark.parametrize("killed_before", ["insert_buckets", "mark_tick_sent"])
async def test_a_scheduler_killed_between_its_writes_leaves_the_tick_to_the_next_one_once(make_queue, monkeypatch,
                                                                                          killed_before):
    doomed_queue, other_queue = make_queue(**QUICK), make_queue(**QUICK)
    doomed = Schedule(doomed_queue, EVERY_MINUTE, "x", name="crashy")
    other = Schedule(other_queue, EVERY_MINUTE, "x", name="crashy")
    await doomed.run_once(now=T0)
    real = getattr(doomed_queue._store, killed_before)

    async def kill(*args: Any, **kwargs: Any) -> None:
        raise Killed

    monkeypatch.setattr(doomed_queue._store, killed_before, kill)
    with pytest.raises(Killed):
        await doomed.run_once(now=T0 + minutes(1))
    monkeypatch.setattr(doomed_queue._store, killed_before, real)
    # the next run of any scheduler, a few ticks later: the claimed tick first, then the latest missed one
    assert await other.run_once(now=T0 + minutes(3)) == every_minute(2, 3)
    assert await doomed.run_once(now=T0 + minutes(3)) == []
    crashy = every_minute(0, 1) + every_minute(2, 3)
    assert {m.id for m in await drained(other_queue, want=len(crashy))} == tick_ids("crashy", crashy)


async def test_a_dst_day_follows_the_cron_librarys_rules(make_queue):
    """Europe/Berlin, 2026-03-29: 02:00 to 03:00 does not exist, so the 02:30 tick fires at 03:00 (cron's rule);
    2026-10-25: 02:00 to 03:00 happens twice, and a daily 02:30 tick fires once."""
    q = make_queue(**QUICK)
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    schedule = Schedule(q, "30 2 * * *", "x", name="daily", tz="Europe/Berlin", missed="catch_up")
    await schedule.run_once(now=dt.datetime(2026, 3, 27, 12, tzinfo=berlin))
    spring = await schedule.run_once(now=dt.datetime(2026, 3, 30, 12, tzinfo=berlin))
    assert [t.astimezone(berlin).isoformat() for t in spring] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]
    autumn = await schedule.run_once(now=dt.datetime(2026, 10, 26, 12, tzinfo=berlin))
    assert [t.astimezone(berlin).isoformat() for t in autumn][-3:] == [
        "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    # every half hour, run every quarter of an hour through the repeated hour: both of its 02:00 and 02:30
    half_hourly = Schedule(q, "*/30 * * * *", "x", name="half-hourly", tz="Europe/Berlin")
    start = dt.datetime(2026, 10, 24, 23, 10, tzinfo=UTC)
    enqueued = []
    for quarter in range(17):
        enqueued += await half_hourly.run_once(now=start + quarter * dt.timedelta(minutes=15))
    assert [t.astimezone(berlin).strftime("%H:%M%z") for t in enqueued] == [
        "01:30+0200", "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100", "03:00+0100", "03:30+0100",
        "04:00+0100"]
    assert enqueued == [dt.datetime(2026, 10, 24, 23, 30, tzinfo=UTC) + i * dt.timedelta(minutes=30)
                        for i in range(8)]


async def test_run_sleeps_until_each_next_tick_of_its_clock(make_queue):
    """``run()`` with a clock that reaches three ticks, each a millisecond after the run before it looked: it
    enqueues the three, then sleeps on (the clock stops) until cancelled."""
    q = make_queue(**QUICK)
    ticks = every_minute(0, 3)
    readings = iter([T0, *(r for t in ticks for r in (t - dt.timedelta(milliseconds=1), t))])
    last = [T0]

    def clock() -> dt.datetime:
        last[0] = next(readings, last[0])
        return last[0]

    runner = asyncio.create_task(Schedule(q, EVERY_MINUTE, "x", name="runner", clock=clock).run())
    await eventually(lambda: last[0] == ticks[-1], what="the clock's last reading")
    received = []
    while len(received) < 3 and (m := await q.reserve(timeout=5)) is not None:
        received.append(m.id)
        await m.ack()
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert set(received) == tick_ids("runner", ticks) and await q.reserve(timeout=0.2) is None


async def test_run_logs_a_failure_and_tries_again(make_queue, memory_db, caplog):
    q = make_queue(**QUICK)
    schedule = Schedule(q, EVERY_MINUTE, "x", name="outage", clock=lambda: T0 + minutes(1))
    await schedule.run_once(now=T0)
    refused = memory_db.faults.refuse("find_one", collection="events.control",
                                      where=lambda op: op.filter == {"_id": "schedule:outage"},
                                      error=OperationFailure("not authorized", 13))
    runner = asyncio.create_task(schedule.run())
    try:
        message = await q.reserve(timeout=5)
    finally:
        runner.cancel()
    assert message is not None and message.id in tick_ids("outage", every_minute(0, 1))
    await message.ack()
    assert refused.hits == 1 and "schedule 'outage': not authorized; trying again" in caplog.text


@pytest.mark.parametrize("args, kwargs, says", [
    (("61 * * * *",), {}, "bad cron expression '61 * * * *'"),
    (("* * *",), {}, "bad cron expression"),
    ((EVERY_MINUTE,), {"tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ((EVERY_MINUTE,), {"missed": "all"}, "missed must be one of"),
    ((EVERY_MINUTE,), {"catch_up_limit": 0}, "catch_up_limit must be an int >= 1"),
    ((EVERY_MINUTE,), {"name": ""}, "name must be a non-empty string"),
])
async def test_bad_input_fails_at_construction_with_a_clear_error(make_queue, args, kwargs, says):
    with pytest.raises(bucketq.InvalidOption, match=says.replace("*", r"\*")):
        Schedule(make_queue(), *args, "x", **kwargs)


async def test_a_naive_now_is_refused(make_queue):
    schedule = Schedule(make_queue(), EVERY_MINUTE, "x")
    with pytest.raises(bucketq.InvalidOption, match="timezone-aware"):
        await schedule.run_once(now=dt.datetime(2026, 1, 5, 9, 0))
    clocked = Schedule(make_queue(), EVERY_MINUTE, "x", clock=lambda: dt.datetime(2026, 1, 5, 9, 0))
    with pytest.raises(bucketq.InvalidOption, match="timezone-aware"):
        await clocked.run_once()

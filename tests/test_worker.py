"""``Worker`` and retry control in handlers: a chosen retry delay, giving up without further tries, a
handler resolving its own message, a per-handler time limit, batch handlers failing part of a batch."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import orjson
import pytest
from pymongo.errors import WriteError

import bucketq
from bucketq.core.logbudget import LogBudget
from bucketq.worker import FAILURE_LOG_LIMIT
from tests.helpers import eventually, step_local_clock

QUICK = {"bucket_max_wait": 0.005, "change_streams": False, "poll_interval": 0.02, "drain_timeout": 0}


async def _run(worker: bucketq.Worker, until: Callable[[], bool | Awaitable[bool]]) -> None:
    """Run ``worker`` until ``until()`` holds, then stop it gracefully."""
    task = asyncio.ensure_future(worker.run())
    try:
        await eventually(until)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def _dead_lettered(q: bucketq.Queue) -> bool:
    return bool(await q.dead_letters())


async def test_a_handler_raising_retry_picks_the_delay_and_the_reason_is_kept(make_queue):
    q = make_queue(**QUICK, max_attempts=2, retry_base=30)
    await q.push("flaky")
    seen: list[tuple[int, float]] = []

    async def handler(message: bucketq.Message) -> None:
        seen.append((message.tries, time.monotonic()))
        raise bucketq.Retry("upstream busy", delay=0.3)

    await _run(bucketq.Worker(q, handler, handle_signals=False), until=lambda: _dead_lettered(q))
    assert [tries for tries, _ in seen] == [0, 1]
    # 0.3 s, not the 30 s backoff: the upper bound is half the backoff, so that a slow machine cannot fail it
    assert 0.25 <= seen[1][1] - seen[0][1] < 15, "retried after the backoff, not the delay the handler chose"
    (dead,) = await q.dead_letters()
    assert "upstream busy" in dead["error"] and dead["tries"] == 2


async def test_the_queue_time_is_measured_by_the_server_clock_not_the_local_one(make_queue, monkeypatch):
    q = make_queue(**QUICK)
    await q.push("stamped by the server's clock")
    step_local_clock(monkeypatch, 3600)  # then this host's wall clock jumps an hour ahead
    timings: list[bucketq.worker.BatchTiming] = []

    async def handler(message: bucketq.Message) -> None:
        pass

    await _run(bucketq.Worker(q, handler, after_batch=timings.append, handle_signals=False), until=lambda: timings)
    assert 0 <= timings[0].queue_time_max_s < 600, "the queue time took in the local clock's step"


async def test_a_handler_raising_reject_dead_letters_at_once(make_queue):
    q = make_queue(**QUICK, max_attempts=5)
    await q.push({"bad": True})
    calls = 0

    async def handler(message: bucketq.Message) -> None:
        nonlocal calls
        calls += 1
        raise bucketq.Reject("schema version 0 is not supported")

    await _run(bucketq.Worker(q, handler, handle_signals=False), until=lambda: _dead_lettered(q))
    assert calls == 1, "rejected messages are not tried again"
    (dead,) = await q.dead_letters()
    assert dead["error"] == "Reject: schema version 0 is not supported" and dead["tries"] == 1


async def test_a_message_dead_lettered_by_its_handler_is_not_tried_again(make_queue):
    q = make_queue(**QUICK, max_attempts=5)
    await q.push("poison")
    message = await q.reserve(timeout=5)
    await message.dead_letter(error=ValueError("cannot parse"), wait=True)
    assert await q.reserve(timeout=0.3) is None
    (dead,) = await q.dead_letters()
    assert dead["_id"] == message.id and dead["error"] == "ValueError: cannot parse"
    with pytest.raises(bucketq.LeaseLost):  # the bucket is finished: nothing of it is held any more
        await message.ack()


async def test_a_hung_handler_is_cut_off_and_its_message_retried_with_the_reason(make_queue):
    q = make_queue(**QUICK, max_attempts=2, retry_base=0.05, retry_max=0.05)
    await q.push("slow")
    started: list[int] = []

    async def handler(message: bucketq.Message) -> None:
        started.append(message.tries)
        await asyncio.sleep(3600)  # hangs

    worker = bucketq.Worker(q, handler, handle_signals=False, handler_timeout=0.2)
    await _run(worker, until=lambda: _dead_lettered(q))
    assert started == [0, 1]
    (dead,) = await q.dead_letters()
    assert "HandlerTimeout" in dead["error"] and "0.2 s" in dead["error"]
    assert worker.failed == 2


async def test_a_batch_handler_fails_part_of_its_batch_with_retry_and_reject(make_queue):
    q = make_queue(**QUICK, max_attempts=3)
    await q.push_many([{"i": i} for i in range(6)])
    calls: list[list[tuple[int, int]]] = []

    async def handler(batch: list[bucketq.Message]) -> dict[str, BaseException]:
        calls.append([(m.payload["i"], m.tries) for m in batch])
        failures: dict[str, BaseException] = {}
        for m in batch:
            if m.payload["i"] == 1 and m.tries == 0:
                failures[m.id] = bucketq.Retry("later", delay=0)
            elif m.payload["i"] == 2:
                failures[m.id] = bucketq.Reject("never")
        return failures

    async def retried_and_rejected() -> bool:
        return [(1, 1)] in calls and await _dead_lettered(q)

    await _run(bucketq.Worker(q, handler, batch_size=10, handle_signals=False), until=retried_and_rejected)
    assert calls[0] == [(i, 0) for i in range(6)], "one batch from the bucket held"
    assert [(1, 1)] in calls
    (dead,) = await q.dead_letters()
    assert orjson.loads(dead["p"]) == {"i": 2} and dead["error"] == "Reject: never" and dead["tries"] == 1


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5"])
def test_a_bad_handler_timeout_is_invalid_option(make_queue, bad):
    async def handler(message: bucketq.Message) -> None: ...

    with pytest.raises(bucketq.InvalidOption):
        bucketq.Worker(make_queue(), handler, handler_timeout=bad)


# -- a bad Retry or Reject, and errors while resolving, never stop the worker --------------------------------------

@pytest.mark.parametrize("kwargs", [{"delay": -1}, {"delay": float("nan")}, {"delay": float("inf")}, {"delay": "5"},
                                    {"delay": True}, {"reason": 5}])
def test_a_bad_retry_is_refused_when_built(kwargs):
    with pytest.raises(bucketq.InvalidOption, match="Retry"):
        bucketq.Retry(**kwargs)


def test_a_reject_without_a_reason_str_is_refused_when_built():
    with pytest.raises(bucketq.InvalidOption, match="Reject takes a reason str"):
        bucketq.Reject(ValueError("not a str"))  # type: ignore[arg-type]
    assert str(bucketq.Reject()) == "rejected by the handler"
    assert bucketq.Retry("later", delay=dt.timedelta(seconds=2)).delay == 2.0


@pytest.mark.backends("memory", "server")
async def test_a_handler_building_a_bad_retry_fails_its_message_and_the_worker_goes_on(make_queue):
    q = make_queue(**QUICK, max_attempts=1)
    await q.push_many(["bad", "good"])
    handled: list[str] = []
    worker: bucketq.Worker

    async def handler(message: bucketq.Message) -> None:
        if message.payload == "bad":
            raise bucketq.Retry("later", delay=-1)  # stopped the whole worker before
        handled.append(message.payload)
        worker.stop()

    worker = bucketq.Worker(q, handler, handle_signals=False)
    await asyncio.wait_for(worker.run(), 10)
    assert handled == ["good"] and (worker.handled, worker.failed) == (1, 1)
    (dead,) = await q.dead_letters()
    assert dead["error"].startswith("InvalidOption: Retry delay must be a number of seconds")


@pytest.mark.backends("memory")
async def test_an_error_resolving_one_message_is_logged_and_the_worker_goes_on(make_queue, memory_db, caplog):
    q = make_queue(**QUICK, dedupe=True, retry_base=0.1, retry_jitter=0)
    await q.push_many([bucketq.Outgoing("first", key="k1"), bucketq.Outgoing("second", key="k2")])
    # The first ack's dedupe key cannot be stored: that ack raises, which stopped the worker before.
    memory_db.faults.refuse("insert", collection="events.inbox", error=WriteError("no space", 14031))
    seen: list[tuple[str, int]] = []
    worker: bucketq.Worker

    async def handler(message: bucketq.Message) -> None:
        seen.append((message.payload, message.tries))
        if len(seen) == 3:
            worker.stop()

    worker = bucketq.Worker(q, handler, handle_signals=False)
    with caplog.at_level(logging.WARNING, logger="bucketq"):
        await asyncio.wait_for(worker.run(), 10)
    assert seen == [("first", 0), ("second", 0), ("first", 1)], "the first is retried: its ack was not stored"
    assert (worker.handled, worker.failed) == (2, 1)
    stats = await q.stats()
    assert stats["ready"] == stats["scheduled"] == stats["in_flight"] == stats["dead"] == 0
    (failure,) = [r for r in caplog.records if r.getMessage().startswith("handler failed")]
    assert "(try 1 of 5): will retry in 0.1 s" in failure.getMessage() and "no space" in failure.exc_text


# -- handler failures are logged, within a budget ---------------------------------------------------------------

@pytest.mark.backends("memory")
async def test_each_handler_failure_is_logged_with_its_id_try_fate_and_traceback(make_queue, caplog):
    q = make_queue(**QUICK, max_attempts=2, retry_base=0.1, retry_jitter=0)
    await q.push_many(["boom", "reject"])
    ids: dict[str, str] = {}

    async def handler(message: bucketq.Message) -> None:
        ids[message.payload] = message.id
        if message.payload == "reject":
            raise bucketq.Reject("schema 0")
        raise RuntimeError("boom")

    worker = bucketq.Worker(q, handler, handle_signals=False)
    with caplog.at_level(logging.WARNING, logger="bucketq"):
        task = asyncio.ensure_future(worker.run())
        while len(await q.dead_letters()) < 2:
            await asyncio.sleep(0.05)
        worker.stop()
        await asyncio.wait_for(task, 10)
    lines = [(r.levelno, r.name, r.getMessage(), r.exc_info) for r in caplog.records
             if r.getMessage().startswith("handler failed")]
    assert [line[2] for line in lines] == [
        f"handler failed on message {ids['boom']} (try 1 of 2): will retry in 0.1 s",
        f"handler failed on message {ids['reject']} (try 1 of 2): dead-lettered: rejected by the handler",
        f"handler failed on message {ids['boom']} (try 2 of 2): dead-lettered: max_attempts (2) reached"]
    assert {(level, name) for level, name, _, _ in lines} == {(logging.WARNING, "bucketq.worker")}
    assert [type(exc_info[1]) for *_, exc_info in lines] == [RuntimeError, bucketq.Reject, RuntimeError]
    assert all(exc_info[2] is not None for *_, exc_info in lines), "with the handler's traceback"


@pytest.mark.backends("memory")
async def test_a_failure_storm_logs_a_bounded_number_of_lines_and_a_count(make_queue, caplog):
    q = make_queue(**QUICK, max_attempts=1)
    await q.push_many(list(range(FAILURE_LOG_LIMIT + 5)))

    async def handler(message: bucketq.Message) -> None:
        raise RuntimeError("storm")

    worker = bucketq.Worker(q, handler, handle_signals=False, concurrency=4)
    with caplog.at_level(logging.WARNING, logger="bucketq"):
        task = asyncio.ensure_future(worker.run())
        while worker.failed < FAILURE_LOG_LIMIT + 5:
            await asyncio.sleep(0.05)
        worker.stop()
        await asyncio.wait_for(task, 10)
    messages = [r.getMessage() for r in caplog.records if r.name == "bucketq.worker"]
    assert sum(m.startswith("handler failed") for m in messages) == FAILURE_LOG_LIMIT
    (summary,) = [m for m in messages if "suppressed" in m]
    assert summary.startswith("5 more handler failures suppressed in the last ")


def test_a_log_budget_allows_its_limit_per_window_and_counts_the_rest():
    budget = LogBudget(2, 10.0)
    assert [budget.take(t) for t in (0.0, 1.0, 2.0, 3.0)] == [True, True, False, False]
    assert budget.close(9.0) is None, "the window has not passed"
    assert budget.close(10.0) == (2, 10.0)
    assert budget.take(11.0) and budget.close(30.0) is None, "nothing suppressed: nothing to say"
    assert budget.take(31.0) and budget.close(32.0, force=True) is None


# -- stopping: a handler past drain_timeout is cancelled and waited for -------------------------------------------

@pytest.mark.backends("memory", "server")
async def test_a_handler_past_drain_timeout_is_cancelled_and_its_message_goes_to_no_one_until_it_returned(
        make_queue):
    options = {**QUICK, "retry_base": 0.05, "retry_max": 0.05}
    first, second = make_queue(**{**options, "drain_timeout": 0.2}), make_queue(**options)
    await first.push("slow")
    events: list[str] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(message: bucketq.Message) -> None:
        events.append("started")
        started.set()
        try:
            await asyncio.Event().wait()  # hangs
        except asyncio.CancelledError:
            events.append("cancelled")
            await release.wait()  # it goes on after the cancellation, until the test lets it end
            events.append("returned")
            raise

    async def other_consumer() -> bucketq.Message:
        message = await second.reserve(timeout=30)
        events.append("delivered to the other consumer")
        return message

    worker = bucketq.Worker(first, handler, handle_signals=False)
    run = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    other = asyncio.ensure_future(other_consumer())
    worker.stop()
    try:
        await eventually(lambda: "cancelled" in events)  # before: the worker waited for its handler forever
        await asyncio.sleep(0.5)  # the other consumer polls every 20 ms meanwhile
        assert not other.done() and not run.done(), "the handler still runs: its message stays held"
    finally:
        release.set()
        if "cancelled" not in events:
            run.cancel()
    await asyncio.wait_for(run, 10)
    again = await asyncio.wait_for(other, 10)
    assert events == ["started", "cancelled", "returned", "delivered to the other consumer"]
    assert (again.payload, again.tries) == ("slow", 1) and worker.failed == 1
    await again.ack()




# -- sync handlers: run on the worker's threads, under the async handler's contract -------------------------------

@pytest.mark.backends("memory", "server")
@pytest.mark.real_time  # threads: the loop cannot foresee when they return
async def test_a_sync_handler_runs_on_a_thread_and_its_return_or_raise_decides(make_queue):
    q = make_queue(**QUICK, max_attempts=2, retry_base=0.05, retry_max=0.05)
    await q.push_many(["ok", "flaky", "bad", "poison"])
    seen: list[tuple[str, int, str]] = []
    loop_thread = threading.current_thread().name

    def handler(message: bucketq.Message) -> None:  # a plain def, as Celery or RQ users write them
        seen.append((message.payload, message.tries, threading.current_thread().name))
        time.sleep(0.01)  # blocking I/O, which would stall an async handler's loop
        if message.payload == "flaky" and message.tries == 0:
            raise ConnectionError("upstream down")
        if message.payload == "bad":
            raise bucketq.Reject("never")
        if message.payload == "poison":
            raise ValueError("cannot parse")

    async def settled() -> bool:
        return len(await q.dead_letters()) == 2 and ("flaky", 1) in [(p, t) for p, t, _ in seen]

    worker = bucketq.Worker(q, handler, concurrency=2, handle_signals=False)
    await _run(worker, until=settled)
    assert sorted((p, t) for p, t, _ in seen) == [("bad", 0), ("flaky", 0), ("flaky", 1), ("ok", 0), ("poison", 0),
                                                  ("poison", 1)]
    assert {name for _, _, name in seen} <= {"bucketq-handler-0", "bucketq-handler-1"} and loop_thread not in {
        name for _, _, name in seen}
    dead = {orjson.loads(d["p"]): d for d in await q.dead_letters()}
    assert dead["bad"]["error"] == "Reject: never" and dead["bad"]["tries"] == 1
    assert dead["poison"]["error"] == "ValueError: cannot parse" and dead["poison"]["tries"] == 2
    assert (worker.handled, worker.failed) == (2, 4)
    assert (await q.stats())["ready"] == 0


@pytest.mark.backends("memory", "server")
@pytest.mark.real_time  # threads: the loop cannot foresee when they return
async def test_a_sync_handler_past_its_timeout_fails_its_message_and_keeps_its_thread_until_it_returns(make_queue):
    q = make_queue(**QUICK, max_attempts=3, retry_base=0.05, retry_max=0.05)
    await q.push("slow")
    release = threading.Event()
    calls: list[tuple[int, str]] = []

    def handler(message: bucketq.Message) -> None:
        calls.append((message.tries, threading.current_thread().name))
        if message.tries == 0:
            release.wait(30)  # cannot be cancelled: it runs on past handler_timeout

    worker = bucketq.Worker(q, handler, handle_signals=False, handler_timeout=0.2)
    assert worker.handler_threads is not None and worker.handler_threads.size == 1  # as many as concurrency
    task = asyncio.ensure_future(worker.run())
    try:
        await eventually(lambda: worker.failed == 1)  # timed out and nacked, while its thread still runs
        await asyncio.sleep(0.5)  # the retry is due after 50 ms: it waits for the one thread
        assert calls == [(0, "bucketq-handler-0")] and worker.handler_threads.taken == 1
        release.set()  # the thread returns: its slot goes to the retry
        await eventually(lambda: worker.handled == 1)
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert calls == [(0, "bucketq-handler-0"), (1, "bucketq-handler-0")]
    assert not await q.dead_letters() and (await q.stats())["ready"] == 0


@pytest.mark.backends("memory", "server")
@pytest.mark.real_time  # threads: the loop cannot foresee when they return
async def test_a_sync_handler_gets_threads_beyond_concurrency_for_calls_past_their_timeout(make_queue):
    q = make_queue(**QUICK, retry_base=0.05, retry_max=0.05)
    await q.push("slow")
    release = threading.Event()
    names: list[str] = []

    def handler(message: bucketq.Message) -> None:
        names.append(threading.current_thread().name)
        if message.tries == 0:
            release.wait(30)

    worker = bucketq.Worker(q, handler, handle_signals=False, handler_timeout=0.2, threads=2)
    try:
        await _run(worker, until=lambda: worker.handled == 1)  # the retry ran while the first call still hangs
    finally:
        release.set()
    assert names == ["bucketq-handler-0", "bucketq-handler-1"]


@pytest.mark.backends("memory", "server")
@pytest.mark.real_time
async def test_stopping_waits_for_a_running_sync_handler_up_to_drain_timeout(make_queue):
    options = {**QUICK, "drain_timeout": 2.0}
    q = make_queue(**options)
    await q.push_many(["quick", "stuck"])
    started = threading.Event()
    release_quick, release_stuck = threading.Event(), threading.Event()

    def handler(message: bucketq.Message) -> None:
        started.set()
        (release_quick if message.payload == "quick" else release_stuck).wait(30)

    worker = bucketq.Worker(q, handler, handle_signals=False)
    run = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 15)
        worker.stop()
        await asyncio.sleep(0.3)
        assert not run.done(), "the worker waits for its running thread"
        release_quick.set()  # it returns within drain_timeout: its message is acked
        await asyncio.wait_for(run, 10)
        assert worker.handled == 1 and worker.failed == 0

        # the second message, on a queue of its own (a worker drains its queue): a call that does not return
        worker = bucketq.Worker(make_queue(**options), handler, handle_signals=False)
        started.clear()
        run = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 15)
        stopped_at = time.monotonic()
        worker.stop()
        await asyncio.wait_for(run, 10)  # bounded: drain_timeout, then the queue's drain
        waited = time.monotonic() - stopped_at
    finally:
        release_quick.set()
        if not run.done():
            release_stuck.set()
    assert waited >= 2.0, "the thread got drain_timeout to return"
    assert worker.failed == 1 and worker.handler_threads is not None and worker.handler_threads.taken == 1  # it runs on
    release_stuck.set()
    again = await make_queue(**options).reserve(timeout=10)  # nacked when the worker stopped: delivered again
    assert again is not None and (again.payload, again.tries) == ("stuck", 1)
    await again.ack()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"threads": 0}, "threads must be None"), ({"threads": 1025}, "threads must be None"),
    ({"threads": True}, "threads must be None"), ({"threads": 2.5}, "threads must be None"),
])
def test_bad_threads_are_invalid_option(make_queue, kwargs, fragment):
    def handler(message: bucketq.Message) -> None: ...

    async def async_handler(message: bucketq.Message) -> None: ...

    with pytest.raises(bucketq.InvalidOption, match=fragment):
        bucketq.Worker(make_queue(), handler, **kwargs)
    with pytest.raises(bucketq.InvalidOption, match="threads is for a sync handler"):
        bucketq.Worker(make_queue(), async_handler, threads=2)
    with pytest.raises(bucketq.InvalidOption, match="handler must be a function"):
        bucketq.Worker(make_queue(), "tasks:handle")


@pytest.mark.backends("memory", "server")
@pytest.mark.real_time
async def test_a_sync_handler_running_past_the_lease_keeps_its_message_held(make_queue):
    """While its thread runs, the message's lease is extended as for an async handler (every state flush): no
    other consumer gets it, even past the lease."""
    options = {**QUICK, "lease": 1.0}  # state_flush_period follows: a third of a second
    q, other = make_queue(**options), make_queue(**options)
    await q.push("long")
    started, release = threading.Event(), threading.Event()

    def handler(message: bucketq.Message) -> None:
        started.set()
        release.wait(30)

    worker = bucketq.Worker(q, handler, handle_signals=False)
    task = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 15)
        assert await other.reserve(timeout=2.5) is None, "delivered elsewhere while its handler ran"
        release.set()
        await eventually(lambda: worker.handled == 1)
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert await other.reserve(timeout=1.5) is None and (await q.stats())["ready"] == 0

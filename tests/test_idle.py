"""Idle consumers (issue 21): with change streams, a consumer waiting on an empty queue sends next to no
commands, and still wakes for every change that makes a bucket claimable. Each wake-up test turns the safety
poll off (``SAFETY_POLL_S``), so that only the wake-up under test can deliver its message in time."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from bucketq.core.claims import claim
from bucketq.wakeup import Wakeup

pytestmark = pytest.mark.backends("memory", "server")

WAKE_S = 15.0  # a generous bound for a wake-up: the safety poll, turned off here, would take 600 s


class NonStreamCommands(monitoring.CommandListener):
    """The names of the commands started, change streams' (getMore, the aggregate that opens one) left out."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pipeline = event.command.get("pipeline") or [{}]
        if event.command_name != "getMore" and "$changeStream" not in pipeline[0]:
            self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture
async def counted(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, Callable[[], int]]]:
    """A target for the consumer under test, and a count of the commands sent through it so far (change
    streams left out). In memory every queue object shares the database: the tests use no other meanwhile."""
    if backend == "memory":
        database = request.getfixturevalue("memory_db")
        yield database, lambda: len([op for op in database.operations if op.method != "watch"])
        return
    listener = NonStreamCommands()
    client: AsyncMongoClient = AsyncMongoClient(request.getfixturevalue("mongo_uri"), event_listeners=[listener])
    yield client, lambda: len(listener.names)
    await client.close()


@pytest.fixture
def no_safety_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bucketq.wakeup.SAFETY_POLL_S", (600.0, 600.0))


async def _streaming(q: Any) -> None:
    """Wait until the consumer's change stream answered once (it polls until then)."""
    for _ in range(200):
        if q._wakeup.streaming:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the change stream never started")


async def _idle(q: Any) -> None:
    """Make ``q``'s consumer idle: a claim that finds nothing, once its stream works."""
    assert await q.reserve(timeout=0) is None
    await _streaming(q)
    assert await q.reserve(timeout=0) is None


async def test_an_idle_consumer_sends_next_to_no_commands_and_wakes_for_a_push_elsewhere(make_queue, counted):
    target, sent = counted
    q = make_queue(target=target)
    await q.push_many(list(range(10)))
    while (message := await q.reserve(timeout=1)) is not None:
        await message.ack()
    await _streaming(q)
    assert await q.reserve(timeout=0) is None
    before = sent()
    for _ in range(8):  # a Worker's idle loop: reserve with a short timeout, again and again
        assert await q.reserve(timeout=0.5) is None
    idle_commands = sent() - before
    # Before issue 21 each reserve claimed and the poll claimed every second: 8 claims or more, and pause reads.
    assert idle_commands <= 2, f"{idle_commands} commands in 4 s of idling"
    await make_queue().push("elsewhere")  # another queue object: only its insert event can wake q
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "elsewhere"
    await message.ack()


async def test_an_idle_consumer_wakes_for_a_bucket_another_consumer_released(make_queue, no_safety_poll):
    q, other = make_queue(), make_queue()
    await other.push_many(["served", "released"])
    first = await other.reserve(timeout=5)
    assert first is not None and first.payload == "served"
    await first.ack()
    await _idle(q)
    waiting = asyncio.ensure_future(q.reserve(timeout=WAKE_S))
    await asyncio.sleep(0.2)
    await other.close()  # the drain releases the bucket, "released" unserved: an update, no insert
    message = await waiting
    assert message is not None and message.payload == "released"
    assert message.tries == 0, "a clean release adds no try"
    await message.ack()


async def test_an_idle_consumer_wakes_when_a_lease_ends(make_queue, sync_db, no_safety_poll):
    q = make_queue(lease=30)
    await q.push("orphan")
    # A consumer that died holding the bucket: its lease ends in 2 s, and nobody extends it or writes again.
    now = dt.datetime.now(dt.timezone.utc)
    _, update, _ = claim(now, 2.0, "dead-token", "gone:1", expired_by=now, partition=0)
    assert sync_db.events.update_one({}, update).modified_count == 1
    await _idle(q)
    message = await q.reserve(timeout=WAKE_S)  # woken by the lease end read after its claim found nothing
    assert message is not None and message.payload == "orphan"
    await message.ack()


async def test_an_idle_consumer_wakes_when_a_delayed_message_becomes_due(make_queue, no_safety_poll):
    q, producer = make_queue(), make_queue()
    await producer.push("early")  # sets the queue up
    message = await q.reserve(timeout=5)
    await message.ack()
    await _idle(q)
    await producer.push("later", delay=2)  # its insert event carries the bucket's due time
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "later"
    await message.ack()


async def test_an_idle_consumer_wakes_for_a_message_delayed_before_it_started(make_queue, no_safety_poll):
    producer = make_queue()
    await producer.push("later", delay=3)
    q = make_queue()
    await _idle(q)  # no event for a push before its stream: the read of the next due time finds it
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "later"
    await message.ack()


async def test_a_paused_idle_consumer_claims_again_after_a_resume_elsewhere(make_queue, no_safety_poll):
    q, operator = make_queue(), make_queue()
    await _idle(q)
    await operator.pause()
    await asyncio.sleep(1.2)  # past the consumer's last read of the pause document
    await operator.push("held back")
    assert await q.reserve(timeout=2) is None, "claimed while paused"
    await operator.resume()
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "held back"
    await message.ack()


async def test_a_waiter_wakes_when_another_check_finds_work_or_a_due_time_comes_sooner(no_safety_poll):
    """Sans I/O: tasks of one consumer that wait (a Worker's) go on as soon as one of them found work (its
    bucket's messages are at hand for all), and as soon as a due time is learnt that is sooner than the poll."""
    wakeup = Wakeup(poll_interval=0.1)
    wakeup.streaming = True  # as when a change stream works: the next poll is the (far) safety poll
    wakeup.checking()
    assert not wakeup.ready
    waiter = asyncio.ensure_future(wakeup.wait(WAKE_S))
    await asyncio.sleep(0.05)
    wakeup.hit()
    await asyncio.wait_for(waiter, 1)
    wakeup.checking()
    waiter = asyncio.ensure_future(wakeup.wait(WAKE_S))
    await asyncio.sleep(0.05)
    wakeup.due_at(time.monotonic() + 0.1)
    await asyncio.wait_for(waiter, 1)
    assert wakeup.ready

"""Idle consumers and stream readers: with change streams, a consumer waiting on an empty queue, or
a reader on a stream with nothing new, sends next to no commands, and still wakes for every change that makes
a bucket claimable (a pause's end too). Each wake-up test turns the safety poll off (``SAFETY_POLL_S``), so
that only the wake-up under test can deliver its message in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from bucketq.core.claims import claim
from bucketq.core.sharding import partition_of
from bucketq.shell.wakeup import Wakeup
from tests.helpers import StartedCommands, eventually, utc_now

pytestmark = pytest.mark.backends("memory", "server")

WAKE_S = 15.0  # a generous bound for a wake-up: the safety poll, turned off here, would take 600 s
IDLE_S = 0.1  # the timeout of each reserve (or read) of an idle loop: each began with a claim before wake-ups


@pytest.fixture
def soon(backend: str) -> float:
    """Seconds ahead for a lease end or a due time that must not have come before the consumer under test went
    idle: past its set-up and first claim, which take the test server longer."""
    return 0.5 if backend == "memory" else 2.0


Sent = Callable[[], list[tuple[str, Any, Any]]]  # the commands sent so far: (name, collection, filter)


def _is_change_stream(event: monitoring.CommandStartedEvent) -> bool:
    """A change stream's command: a getMore, or the aggregate that opens one."""
    pipeline = event.command.get("pipeline") or [{}]
    return event.command_name == "getMore" or "$changeStream" in pipeline[0]


@pytest.fixture
async def counted(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, Sent]]:
    """A target for the consumer or reader under test, and the commands sent through it so far (change streams
    left out). In memory every queue object shares the database: the tests use no other meanwhile, or tell
    theirs apart by collection."""
    if backend == "memory":
        database = request.getfixturevalue("memory_db")
        yield database, lambda: [(op.command, op.collection, op.filter) for op in database.operations
                                 if op.method != "watch"]
        return
    listener = StartedCommands()
    client: AsyncMongoClient = AsyncMongoClient(request.getfixturevalue("mongo_uri"), event_listeners=[listener])
    yield client, lambda: [(event.command_name, event.command.get(event.command_name),
                            event.command.get("query", event.command.get("filter")))
                           for event in listener.events if not _is_change_stream(event)]
    await client.close()


@pytest.fixture
def no_safety_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bucketq.shell.wakeup.SAFETY_POLL_S", (600.0, 600.0))


@pytest.fixture(autouse=True)
def short_stream_await(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty change-stream getMores held 0.1 s rather than a second (``STREAM_AWAIT_MS``, and the two times
    ``bucketq.shell.wakeup`` derives from it): a stream answers first after that wait (the in-memory one, like a real
    server), and every test here waits for that answer (``_streaming``) before it idles."""
    for module in ("changes", "queue_store", "stream_store"):
        monkeypatch.setattr(f"bucketq.store.aio.{module}.STREAM_AWAIT_MS", 100)
    monkeypatch.setattr("bucketq.shell.wakeup.STREAM_QUICK_EMPTY_S", 0.05)
    monkeypatch.setattr("bucketq.shell.wakeup.STREAM_PAUSE_MAX_S", 0.1)


async def _streaming(q: Any) -> None:
    """Wait until the change streams of a queue's consumer (or of a stream reader) answered (it polls until then)."""
    await eventually(lambda: q._wakeup.streaming, what="the change stream answering")


async def _idle(q: Any) -> None:
    """Make ``q``'s consumer idle: a claim that finds nothing, once its stream works."""
    assert await q.reserve(timeout=0) is None
    await _streaming(q)
    assert await q.reserve(timeout=0) is None


async def test_an_idle_consumer_sends_next_to_no_commands_and_wakes_for_a_push_elsewhere(make_queue, counted):
    target, sent = counted
    q = make_queue(target=target, poll_interval=0.05)  # a streaming consumer never polls at its interval
    await q.push_many(list(range(10)))
    for _ in range(10):
        message = await q.reserve(timeout=WAKE_S)
        assert message is not None
        await message.ack(wait=True)  # written now, not at a flush while idling
    await _streaming(q)
    assert await q.reserve(timeout=0) is None
    before = len(sent())
    for _ in range(8):  # a Worker's idle loop: reserve with a short timeout, again and again
        assert await q.reserve(timeout=IDLE_S) is None
    idle_commands = len(sent()) - before
    # Before wake-ups each reserve claimed and the poll claimed every poll interval: 8 claims or more, and pause
    # reads.
    assert idle_commands <= 2, f"{idle_commands} commands in {8 * IDLE_S:g} s of idling: {sent()[before:]}"
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


async def test_an_idle_consumer_wakes_when_a_lease_ends(make_queue, sync_db, no_safety_poll, soon):
    q = make_queue(lease=30)
    await q.push("orphan")
    # A consumer that died holding the bucket: its lease ends soon, and nobody extends it or writes again.
    now = utc_now()
    _, update, _ = claim(now, soon, "dead-token", "gone:1", expired_by=now, partition=0)
    assert sync_db.events.update_one({}, update).modified_count == 1
    await _idle(q)
    message = await q.reserve(timeout=WAKE_S)  # woken by the lease end read after its claim found nothing
    assert message is not None and message.payload == "orphan"
    await message.ack()


async def test_an_idle_consumer_wakes_when_a_delayed_message_becomes_due(make_queue, no_safety_poll, soon):
    q, producer = make_queue(), make_queue()
    await producer.push("early")  # sets the queue up
    message = await q.reserve(timeout=5)
    await message.ack()
    await _idle(q)
    await producer.push("later", delay=soon)  # its insert event carries the bucket's due time
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "later"
    await message.ack()


async def test_an_idle_consumer_wakes_for_a_message_delayed_before_it_started(make_queue, no_safety_poll, soon):
    producer = make_queue()
    await producer.push("later", delay=soon)
    q = make_queue()
    await _idle(q)  # no event for a push before its stream: the read of the next due time finds it
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "later"
    await message.ack()


async def test_a_paused_idle_consumer_reads_the_pause_rarely_and_a_resume_elsewhere_wakes_it(
        make_queue, counted, no_safety_poll):
    target, sent = counted
    q, operator = make_queue(target=target), make_queue()

    def pause_reads() -> int:
        return len([c for c in sent() if c[0] == "find" and c[1] == "events.control"])

    await _idle(q)
    await operator.pause()  # announced to q by its change stream on events.control
    await eventually(lambda: q._store.pause._read_at is None, what="the pause announced")
    before = pause_reads()
    for i in range(6):  # each insert wakes q: it reads the pause once (announced), and claims nothing
        await operator.push("held back" if i == 0 else f"later {i}")
        assert await q.reserve(timeout=0.25) is None, "claimed while paused"
    # Before: a paused consumer read the pause document every PAUSE_REFRESH_S (1 s), at a wake-up or a timer:
    # twice at least in these 1.5 s.
    assert pause_reads() - before <= 1, f"{pause_reads() - before} pause reads in 1.5 s of a paused idle consumer"
    await operator.resume()
    message = await q.reserve(timeout=WAKE_S)  # no poll comes before 600 s: only the resume's event wakes q
    assert message is not None and message.payload == "held back"
    await message.ack()


async def test_a_wake_up_names_its_partition_and_the_consumer_claims_there_first(make_queue, counted,
                                                                                   no_safety_poll):
    target, sent = counted
    q, producer = make_queue(target=target, partitions=4), make_queue(partitions=4)
    await _idle(q)
    pushed = partition_of("g", 4)  # an ordered group's bucket goes to the group's partition
    q._consumer._rotation._start = (pushed + 1) % 4  # without the event's partition, its first claim looks there

    def claims() -> list[Any]:
        return [c[2] for c in sent() if c[0] == "findAndModify" and c[1] == "events"]

    before = len(claims())
    await producer.push("one partition", group="g")
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "one partition"
    await message.ack()
    assert [c["pt"] for c in claims()[before:]][:1] == [pushed], "the first claim after the push was elsewhere"


async def test_an_idle_stream_reader_sends_next_to_no_commands_and_reads_a_new_event_soon(
        make_stream, counted, no_safety_poll):
    target, sent = counted
    stream = make_stream(target=target)  # polls every 10 ms without a change stream
    await stream.push("first")
    reader = stream.reader("g", start="beginning")
    message = await reader.read(timeout=5)
    assert message is not None and message.payload == "first"
    await message.ack()
    await _streaming(reader)
    assert await reader.read(timeout=0) is None
    before = len(sent())
    for _ in range(8):  # a reader's idle loop
        assert await reader.read(timeout=IDLE_S) is None
    idle_commands = len(sent()) - before
    # Before: a look at the group (1 + 2 per partition queries) every poll interval: dozens in these 0.8 s.
    assert idle_commands <= 2, f"{idle_commands} commands in {8 * IDLE_S:g} s of an idle reader"
    await make_stream().push("later")  # another stream object: only its insert event can wake the reader
    message = await reader.read(timeout=WAKE_S)
    assert message is not None and message.payload == "later"
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

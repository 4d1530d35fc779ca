"""Idle consumers and stream readers: with change streams, a consumer waiting on an empty queue, or
a reader on a stream with nothing new, sends next to no commands, and still wakes for every change that makes
a bucket claimable (a pause's end too). Each wake-up test turns the safety poll off (``SAFETY_POLL_S``), so
that only the wake-up under test can deliver its message in time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring

from bucketq.core.claims import claim
from bucketq.core.sharding import partition_of
from bucketq.shell.wakeup import Shared, Wakeup
from tests.helpers import LosableWatch, StartedCommands, eventually, server_proxy, utc_now

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
async def memory_db_or_client(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The in-memory database, or a client of the test server: a target that queue objects can share."""
    if backend == "memory":
        yield request.getfixturevalue("memory_db")
        return
    client: AsyncMongoClient = AsyncMongoClient(request.getfixturevalue("mongo_uri"), tz_aware=True)
    yield client
    await client.close()


@pytest.fixture
def no_safety_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bucketq.shell.wakeup.SAFETY_POLL_S", (600.0, 600.0))


@pytest.fixture(autouse=True)
def short_stream_await(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty change-stream getMores held 0.1 s rather than a second (``STREAM_AWAIT_MS``, and the longest pause
    ``bucketq.shell.wakeup`` derives from it): a stream answers first after that wait (the in-memory one, like a
    real server), and every test here waits for that answer (``_streaming``) before it idles."""
    for module in ("changes", "queue_store", "stream_store"):
        monkeypatch.setattr(f"bucketq.store.aio.{module}.STREAM_AWAIT_MS", 100)
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
    await eventually(lambda: q._pause._read_at is None, what="the pause announced")
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
    # without the event's partition, its first claim looks there
    q._consumer._claiming._rotation._start = (pushed + 1) % 4

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


ROUND_S = 0.2  # a housekeeping round, shortened (60 s in use)


@pytest.fixture
def quick_housekeeping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bucketq.core.housekeeping.HOUSEKEEPING_EVERY_S", ROUND_S)
    monkeypatch.setattr("bucketq.core.housekeeping.HOUSEKEEPER_LEASE_S", 5 * ROUND_S)


async def test_consumers_of_one_queue_run_one_round_of_housekeeping_deletes_a_period_not_one_each(
        make_queue, counted, quick_housekeeping):
    target, sent = counted
    consumers = [make_queue(target=target) for _ in range(5)]
    for q in consumers:  # each one's first claim starts its housekeeping
        assert await q.reserve(timeout=0) is None
    before = len(sent())
    started = time.monotonic()
    await asyncio.sleep(10 * ROUND_S)
    rounds = (time.monotonic() - started) / ROUND_S
    deletes = Counter(collection for name, collection, _ in sent()[before:] if name == "delete")
    # Before the lease each consumer ran each round: 5 times as many deletes of each collection.
    for collection in ("events.quarantine", "events.inbox", "events"):
        assert 1 <= deletes[collection] <= rounds + 1, f"{deletes[collection]} deletes of {collection} in " \
                                                       f"{rounds:.1f} rounds of 5 consumers: {dict(deletes)}"
    # The other consumers spend a try now and then at taking the lease (one a lease, jittered), not a round each.
    tries = sum(1 for name, collection, _ in sent()[before:] if name == "update" and collection == "events.control")
    assert tries <= rounds + 1 + 4 * 10 * ROUND_S / (0.5 * 5 * ROUND_S) + 4


@pytest.mark.timeout(30 * 60)  # the loop's time, skipped ahead by the fast clock: seconds of real time
async def test_idle_consumers_cost_about_one_command_a_minute_each_and_read_the_pause_only_after_an_event(
        make_queue, memory_db):
    """Over 20 minutes idle (skipped by the in-memory tests' fast clock): no pause read without a pause event, the
    deletes of housekeeping once per queue, and each consumer's own cost (its safety polls, its tries at the
    housekeeping lease, its clock's resyncs) about one command a minute."""
    consumers = [make_queue(target=memory_db) for _ in range(4)]
    for q in consumers:
        await _idle(q)

    async def worker(q: Any) -> None:  # a Worker's idle loop
        while await q.reserve(timeout=10) is None:
            pass

    start, began = len(memory_db.operations), time.monotonic()
    workers = [asyncio.ensure_future(worker(q)) for q in consumers]
    await asyncio.sleep(20 * 60)
    minutes = (time.monotonic() - began) / 60
    assert not any(w.done() for w in workers)
    ops = [op for op in memory_db.operations[start:] if op.method != "watch"]
    kinds = Counter(f"{op.command} {op.collection}" for op in ops)
    assert all(q._wakeup.streaming for q in consumers)
    # Before: each consumer read the pause document at each safety poll (every 40 to 60 s)...
    assert kinds["find events.control"] == 0, dict(kinds)
    # ... and ran the retention deletes every minute: 4 consumers, 4 rounds a minute.
    assert kinds["delete events.quarantine"] <= minutes + 1, dict(kinds)
    # The rest, but for the lease holder's round each minute (its deletes and the renewal of its lease).
    own = len(ops) - sum(kinds[f"delete {c}"] for c in ("events.quarantine", "events.inbox", "events")) - minutes
    per_consumer_minute = own / len(consumers) / minutes
    assert per_consumer_minute <= 1.2, f"{per_consumer_minute:.2f} commands / consumer / minute: {dict(kinds)}"
    await make_queue().push("still woken")
    done, _ = await asyncio.wait(workers, timeout=WAKE_S, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, "one consumer (only) got the message"
    for w in workers:
        w.cancel()


async def test_a_consumer_whose_change_stream_falls_silent_polls_instead(make_queue, mongo_uri, request,
                                                                         monkeypatch, no_safety_poll, caplog):
    """A getMore that never comes back (a connection that hangs, with no error to say so): the stream counts as
    lost after ``STREAM_SILENT_S``, and the consumer polls, so a push it hears nothing of still reaches it."""
    monkeypatch.setattr("bucketq.shell.wakeup.STREAM_SILENT_S", 1.0)
    proxy = server_proxy(request, make_queue)
    q = make_queue(target=proxy.uri, poll_interval=0.2)
    await _idle(q)
    proxy.delay("getMore", seconds=600, times=1000)  # every stream's next getMore hangs
    await asyncio.sleep(0.5)  # the getMores under way now hang (each answered within 0.1 s before)
    await make_queue().push("unannounced")
    # Before: the consumer waited for the safety poll (600 s here), its streams taken as healthy all along.
    message = await q.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "unannounced"
    await message.ack()
    # Not ``not streaming``: the stream opened again after the loss starts a second back, so its first answer
    # (no getMore: the aggregate's) may carry the push, and it counts as streaming until it falls silent again.
    assert "has not answered for 1 s: polling instead" in caplog.text
    proxy.disarm()


def _watches_opened(backend: str, target: Any, listener: StartedCommands | None) -> int:
    """The change streams opened so far through ``target``'s client (or the in-memory database)."""
    if backend == "memory":
        return len([op for op in target.operations if op.method == "watch"])
    assert listener is not None
    return len([event for event in listener.events if event.command_name == "aggregate"
                and _is_change_stream(event)])


async def test_queue_objects_of_one_process_share_one_change_stream_per_collection(make_queue, backend, request):
    """Three consumers of a queue on one client watch its collection and its ``Q.control`` through two streams,
    not six; one that closes leaves the others' streams open, and each is still woken."""
    listener = None
    if backend == "memory":
        target = request.getfixturevalue("memory_db")
    else:
        listener = StartedCommands()
        target = AsyncMongoClient(request.getfixturevalue("mongo_uri"), event_listeners=[listener], tz_aware=True)
    consumers = [make_queue(target=target) for _ in range(3)]
    for q in consumers:
        await _idle(q)
    # Before: two streams per queue object (its buckets and its Q.control), six here.
    assert _watches_opened(backend, target, listener) == 2
    await consumers[0].close()
    await asyncio.sleep(0.3)
    assert all(q._wakeup.streaming for q in consumers[1:])
    await make_queue().push("after a close")
    reserves = [asyncio.ensure_future(q.reserve(timeout=WAKE_S)) for q in consumers[1:]]
    done, waiting = await asyncio.wait(reserves, return_when=asyncio.FIRST_COMPLETED)
    for reserve in waiting:
        reserve.cancel()
    message = done.pop().result()
    assert message is not None and message.payload == "after a close"
    await message.ack()
    assert _watches_opened(backend, target, listener) == 2
    if listener is not None:
        for q in consumers[1:]:
            await q.close()
        await target.close()


async def test_queue_objects_given_one_uri_share_a_client_closed_with_the_last(make_queue, mongo_uri):
    first, second = make_queue(), make_queue(name="other")
    client = first.database.client
    assert second.database.client is client  # before: a client of its own each
    await first.push("one")
    await first.close()
    assert not client._closed
    await second.push("two")  # the client the closed queue shared still serves the other
    message = await second.reserve(timeout=WAKE_S)
    assert message is not None and message.payload == "two"
    await message.ack()
    await second.close()
    assert client._closed
    assert make_queue().database.client is not client


async def test_a_shared_change_stream_that_fails_sends_each_queue_polling_and_is_opened_again(
        make_queue, memory_db_or_client, no_safety_poll):
    target = memory_db_or_client
    consumers = [make_queue(target=target, poll_interval=0.2) for _ in range(2)]
    shared = consumers[0]._watches[0]
    losable = LosableWatch(shared.watch)
    for q in consumers:
        q._watches[0] = Shared(shared.key, losable)
        await _idle(q)

    def feeds(q: Any) -> list[Any]:
        return [feed for feed, _ in q._wakeup._feeds]

    first = feeds(consumers[0])
    assert feeds(consumers[1]) == first, "one stream per collection for both queue objects"
    losable.lose()
    await eventually(lambda: first[0].ended, what="the shared stream ending")
    assert not any(q._wakeup.streaming for q in consumers), "each queue polls"
    await make_queue().push("while polling")
    reserves = [asyncio.ensure_future(q.reserve(timeout=WAKE_S)) for q in consumers]
    done, waiting = await asyncio.wait(reserves, return_when=asyncio.FIRST_COMPLETED)
    for reserve in waiting:
        reserve.cancel()
    message = done.pop().result()
    assert message is not None and message.payload == "while polling"
    await message.ack()
    for q in consumers:  # a claim opens the lost stream again, shared again
        assert await q.reserve(timeout=0) is None
    await eventually(lambda: all(q._wakeup.streaming for q in consumers), what="the stream opened again")
    again = feeds(consumers[0])
    assert feeds(consumers[1]) == again and again[0] is not first[0] and again[1] is first[1]


async def test_a_burst_wakes_no_more_consumers_of_a_process_than_it_has_buckets(make_queue, memory_db_or_client,
                                                                               no_safety_poll):
    """Eight idle consumers on one client, a burst of 3 buckets: each bucket's event wakes one consumer that
    waits, in turn, not all eight. Bound: the consumers that claimed at all are at most the buckets (each woken
    one claims its bucket, then once more, finding none); the claims at most 2 a bucket and one more."""
    consumers = [make_queue(target=memory_db_or_client) for _ in range(8)]
    for q in consumers:
        await _idle(q)
    before = [Counter(q._consumer.claim_counts) for q in consumers]
    got: list[Any] = []

    async def worker(q: Any) -> None:
        while (message := await q.reserve(timeout=WAKE_S)) is not None:
            got.append(message.payload)
            await message.ack()

    workers = [asyncio.ensure_future(worker(q)) for q in consumers]
    await asyncio.sleep(0.2)  # every worker waits
    await make_queue(bucket_max_size=5).push_many(list(range(15)))  # three buckets of 5, inserted at once
    await eventually(lambda: len(got) == 15, timeout=WAKE_S, what="the burst served")
    await asyncio.sleep(0.5)  # the claims after it, if any
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    claims = [q._consumer.claim_counts - b for q, b in zip(consumers, before, strict=True)]
    woken = sum(1 for c in claims if c)
    # Before: every event woke all eight, each claimed: 8 consumers, 8 claims or more.
    assert woken <= 3, f"{woken} consumers claimed for 3 buckets: {claims}"
    assert sum(sum(c.values()) for c in claims) <= 2 * 3 + 1, claims
    assert sorted(got) == list(range(15))

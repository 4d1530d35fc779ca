"""bucketq contender: the library under test, through its public async API.

push: push_nowait per message with at most ``window`` un-acknowledged pushes, done when every push is
durable. push_many (and fill, untimed, before a consume): push_many calls of ``FILL_CHUNK`` messages. Both build
their payload dicts before the clock starts, as the floor does (the user's data, not the queue's work); the
encoding is timed.
stream_push: the same as push, into a ``bucketq.Stream``. consume: ``concurrency`` tasks doing reserve + ack;
consume_batch: the same with ``reserve_many`` (batches of ``BATCH``, each batch acked by one ``ack_many``), as a
batch handler would. end_to_end: both at once in
one process.
latency: sequential awaited pushes on an idle queue with default options, each timed; then, untimed, what
consuming the buckets they made costs.
idle: ``idle_consumers`` queue objects consume a prefilled backlog (untimed), then wait on the empty queue with
``reserve(timeout=IDLE_RESERVE_S)`` in a loop for ``idle_window_s``: the commands they send, by kind.
stream_idle: the same with readers of one group, each of its own ``bucketq.Stream``, reading a prefilled stream
(``stream_fill``: as fill) with ``read(timeout=IDLE_RESERVE_S)``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from pymongo import AsyncMongoClient, monitoring

from bench.worker import Ctx, main, payload, split, write_concern

FILL_CHUNK = 4096
IDLE_RESERVE_S = 10.0  # each idle consumer's reserve timeout
BATCH = 100  # consume_batch: messages per reserve_many
Role = Callable[[Ctx, Any], Awaitable[None]]


async def _produce(ctx: Ctx, q: Any, payloads: Iterable[dict], counted: bool) -> None:
    from bucketq import BufferFull

    pending: collections.deque[asyncio.Future] = collections.deque()
    for item in payloads:
        while True:
            try:
                pending.append(q.push_nowait(item))
                break
            except BufferFull:  # the library's own backpressure: wait for the oldest push, then retry
                await pending.popleft()
                if counted:
                    ctx.mark_in_loop()
        if len(pending) >= ctx.spec["window"]:
            await pending.popleft()
            if counted:
                ctx.mark_in_loop()
    while pending:
        await pending.popleft()
        if counted:
            ctx.mark_in_loop()


def _sent_ts(body: Any) -> float:
    return (orjson.loads(body) if isinstance(body, (bytes, bytearray, memoryview)) else body)["ts"]


async def _consume(ctx: Ctx, q: Any, producers_done: asyncio.Event, timed_latency: bool,
                   mark: Callable[[int], None], batch: int = 1) -> None:
    """Reserve and ack (``batch`` > 1: ``reserve_many`` and one ``ack_many`` of the batch, as a batch handler
    would) until the producers are done and nothing came for idle_s; ``mark`` after each ack (each ``ack_many``)."""
    idle_s = ctx.spec["idle_s"]
    while True:
        timeout = idle_s if producers_done.is_set() else min(idle_s, 0.25)
        if batch > 1:
            messages = await q.reserve_many(batch, timeout=timeout)
            if messages:
                if timed_latency:
                    for msg in messages:
                        ctx.latency(_sent_ts(msg.payload))
                await q.ack_many(messages)
                mark(len(messages))
                continue
        elif (msg := await q.reserve(timeout=timeout)) is not None:
            if timed_latency:
                ctx.latency(_sent_ts(msg.payload))
            await msg.ack()
            mark()
            continue
        if producers_done.is_set():
            return


async def _consumers(ctx: Ctx, q: Any, producers_done: asyncio.Event, timed_latency: bool,
                     mark: Callable[[int], None] | None = None, batch: int = 1) -> None:
    await asyncio.gather(*(_consume(ctx, q, producers_done, timed_latency, mark or ctx.mark_in_loop, batch)
                           for _ in range(ctx.spec["concurrency"])))


class _Tally:
    """Messages consumed outside the timed phase: how many, and when the last one was acked."""

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0

    def mark(self, n: int = 1) -> None:
        self.count += n
        self.last = time.time()


async def _consume_cost(ctx: Ctx, q: Any) -> str:
    """Untimed: consume everything stored, and say what the buckets cost to consume (commands are counted up
    to the last ack, so the consumers' final idle wait is left out)."""
    buckets = await q.database[ctx.spec["queue"]].count_documents({})
    tally = _Tally()
    done = asyncio.Event()
    done.set()
    started = time.time()
    await _consumers(ctx, q, done, False, tally.mark)
    commands = sum(1 for t, _ in ctx.commands.events if started <= t <= tally.last)
    seconds = tally.last - started
    return (f"then consumed {tally.count:,} msgs from {buckets:,} buckets: {commands / max(1, tally.count):.2f} "
            f"cmds/msg, {tally.count / seconds if seconds > 0 else 0:,.0f} msgs/s")


async def fill(ctx: Ctx, q: Any) -> None:
    chunks = [[payload(i, ctx.pad) for i in range(n)]
              for n in split(ctx.spec["messages"], -(-ctx.spec["messages"] // FILL_CHUNK) or 1)]
    await asyncio.to_thread(ctx.go)
    for chunk in chunks:
        await q.push_many(chunk)
        ctx.mark_in_loop(len(chunk))
    ctx.stop()
    with ctx.tail():
        await q.drain()


async def push(ctx: Ctx, q: Any) -> None:
    payloads = [payload(i, ctx.pad) for i in range(ctx.spec["messages"])]
    await asyncio.to_thread(ctx.go)
    await _produce(ctx, q, payloads, counted=True)
    ctx.stop()
    with ctx.tail():
        await q.drain()


async def latency(ctx: Ctx, q: Any) -> None:
    await q.push(payload(-1, ctx.pad))  # sets the queue up (clock, indexes) before the clock starts
    await asyncio.to_thread(ctx.go)
    for i in range(ctx.spec["messages"]):
        started = time.perf_counter()
        await q.push(payload(i, ctx.pad))
        ctx.sample(started)
    ctx.stop()
    ctx.notes.append(await _consume_cost(ctx, q))
    with ctx.tail():
        await q.drain()


async def consume(ctx: Ctx, q: Any, batch: int = 1) -> None:
    done = asyncio.Event()
    done.set()
    await asyncio.to_thread(ctx.go)
    await _consumers(ctx, q, done, timed_latency=False, batch=batch)
    ctx.stop(at_last_mark=True)
    with ctx.tail():
        await q.drain()


async def end_to_end(ctx: Ctx, q: Any) -> None:
    done = asyncio.Event()

    async def producer() -> None:
        try:
            # built as sent: each payload carries its send time, for the push-to-handler latency
            await _produce(ctx, q, (payload(i, ctx.pad) for i in range(ctx.spec["messages"])), counted=False)
        finally:
            done.set()

    await asyncio.to_thread(ctx.go)
    await asyncio.gather(producer(), _consumers(ctx, q, done, timed_latency=True))
    ctx.stop(at_last_mark=True)
    with ctx.tail():
        await q.drain()


class CommandKinds(monitoring.CommandListener):
    """Counts, while ``active``, the commands an idle consumer sends by kind: ``claims`` (findAndModify),
    ``pause_reads`` (reads of the control collection), ``next_due`` (reads of the next due time), ``getmores``
    (its change stream: getMore, and the aggregate that opens it) and ``other`` (named in ``others``, by
    command and collection)."""

    def __init__(self) -> None:
        self.active = False
        self.kinds: collections.Counter[str] = collections.Counter(dict.fromkeys(
            ("claims", "pause_reads", "next_due", "getmores", "other"), 0))
        self.others: collections.Counter[str] = collections.Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.active:
            return
        name, target = event.command_name, event.command.get(event.command_name)
        pipeline = event.command.get("pipeline") or [{}]
        if name == "findAndModify":
            self.kinds["claims"] += 1
        elif name == "find" and isinstance(target, str) and target.endswith(".control"):
            self.kinds["pause_reads"] += 1
        elif name == "find" and "due" in (event.command.get("filter") or {}):
            self.kinds["next_due"] += 1
        elif name == "getMore" or (name == "aggregate" and "$changeStream" in pipeline[0]):
            self.kinds["getmores"] += 1
        else:
            self.kinds["other"] += 1
            self.others[f"{name} {target}"] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


IDLE_KINDS = CommandKinds()
STREAM_ROLES = ("stream_push", "stream_fill", "stream_idle")  # the roles that work on a bucketq.Stream


async def _idle(ctx: Ctx, q: Any, owners: list[Any], waiters: list[Any],
                take: Callable[[Any, float], Awaitable[Any]]) -> None:
    """``waiters`` (``idle_consumers`` of them, of ``owners``: the queue or stream objects besides ``q``) take the
    backlog (``take``: the next message or None, acked), untimed, then wait with ``take`` for ``idle_window_s``."""

    async def backlog(waiter: Any) -> None:
        while await take(waiter, 1.0) is not None:
            ctx.mark()

    async def wait(waiter: Any, until: float) -> None:
        while (left := until - time.monotonic()) > 0:
            if (message := await take(waiter, min(IDLE_RESERVE_S, left))) is not None:
                ctx.notes.append(f"unexpected message in the idle window: {message}")

    try:
        await asyncio.gather(*(backlog(w) for w in waiters))
        await asyncio.to_thread(ctx.go)
        IDLE_KINDS.active = True
        until = time.monotonic() + ctx.spec["idle_window_s"]
        await asyncio.gather(*(wait(w, until) for w in waiters))
        IDLE_KINDS.active = False
        ctx.stop()
        ctx.extra["idle"] = {"consumers": len(waiters), "kinds": dict(IDLE_KINDS.kinds),
                             "others": dict(IDLE_KINDS.others)}
    finally:
        for owner in owners:
            await owner.close()
    with ctx.tail():
        await q.drain()


async def idle(ctx: Ctx, q: Any) -> None:
    import bucketq

    s = ctx.spec
    others = [bucketq.Queue(q.database.client, name=s["queue"], db=s["db"]) for _ in range(s["idle_consumers"] - 1)]

    async def take(consumer: Any, timeout: float) -> Any:
        if (message := await consumer.reserve(timeout=timeout)) is not None:
            await message.ack()
            return message.id
        return None

    await _idle(ctx, q, others, [q, *others], take)


async def stream_idle(ctx: Ctx, stream: Any) -> None:
    import bucketq

    s = ctx.spec
    others = [bucketq.Stream(stream.database.client, name=s["queue"], db=s["db"])
              for _ in range(s["idle_consumers"] - 1)]

    async def take(reader: Any, timeout: float) -> Any:
        if (message := await reader.read(timeout=timeout)) is not None:
            await message.ack()
            return str(message.position)
        return None

    await _idle(ctx, stream, others, [owner.reader("idle", start="beginning") for owner in [stream, *others]], take)


async def _with_queue(ctx: Ctx, role: Role) -> None:
    import bucketq  # here, so that a library still being written shows as an error row

    s = ctx.spec
    client: AsyncMongoClient = AsyncMongoClient(s["uri"], event_listeners=[ctx.commands, IDLE_KINDS],
                                                w=write_concern(s))
    tuned = {"bucket_max_size": s["bucket_max_size"], "bucket_max_wait": s["bucket_max_wait_s"]}
    try:
        if s["role"] in STREAM_ROLES:  # the same producer, writing a stream: sequences allocated per write
            q = bucketq.Stream(client, name=s["queue"], db=s["db"], **tuned)
        else:
            q = bucketq.Queue(client, name=s["queue"], db=s["db"], **({} if s["role"] == "latency" else tuned))
        async with q:
            await role(ctx, q)
    finally:
        await client.close()


def _sync(role: Role) -> Callable[[Ctx], None]:
    return lambda ctx: asyncio.run(_with_queue(ctx, role))


if __name__ == "__main__":
    main({"fill": _sync(fill), "push": _sync(push), "consume": _sync(consume), "end_to_end": _sync(end_to_end),
          "latency": _sync(latency), "consume_batch": _sync(lambda ctx, q: consume(ctx, q, BATCH)),
          "stream_push": _sync(push), "push_many": _sync(fill), "idle": _sync(idle),
          "stream_fill": _sync(fill), "stream_idle": _sync(stream_idle)})

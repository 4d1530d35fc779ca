"""bucketq contender: the library under test, through its public async API.

push: push_nowait per message with at most ``window`` un-acknowledged pushes, done when every push is
durable. push_many (and fill, untimed, before a consume): push_many calls of ``FILL_CHUNK`` messages.
stream_push: the same as push, into a ``bucketq.Stream``. consume: ``concurrency`` tasks doing reserve + ack;
consume_batch: the same with ``reserve_many`` (batches of ``BATCH``, each message acked on its own), as a batch
handler would. end_to_end: both at once in
one process.
latency: sequential awaited pushes on an idle queue with default options, each timed; then, untimed, what
consuming the buckets they made costs.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pymongo import AsyncMongoClient

from bench.worker import Ctx, main, payload, split, write_concern

FILL_CHUNK = 4096
BATCH = 100  # consume_batch: messages per reserve_many
Role = Callable[[Ctx, Any], Awaitable[None]]


async def _produce(ctx: Ctx, q: Any, n: int, counted: bool) -> None:
    from bucketq import BufferFull

    pending: collections.deque[asyncio.Future] = collections.deque()
    for i in range(n):
        while True:
            try:
                pending.append(q.push_nowait(payload(i, ctx.pad)))
                break
            except BufferFull:  # the library's own backpressure: wait for the oldest push, then retry
                await pending.popleft()
                if counted:
                    ctx.mark()
        if len(pending) >= ctx.spec["window"]:
            await pending.popleft()
            if counted:
                ctx.mark()
    while pending:
        await pending.popleft()
        if counted:
            ctx.mark()


def _sent_ts(body: Any) -> float:
    return (orjson.loads(body) if isinstance(body, (bytes, bytearray, memoryview)) else body)["ts"]


async def _consume(ctx: Ctx, q: Any, producers_done: asyncio.Event, timed_latency: bool,
                   mark: Callable[[], None], batch: int = 1) -> None:
    """Reserve (``batch`` at a time) and ack until the producers are done and nothing came for idle_s; ``mark``
    after each ack."""
    idle_s = ctx.spec["idle_s"]
    while True:
        messages = await q.reserve_many(batch, timeout=idle_s if producers_done.is_set() else min(idle_s, 0.25))
        if not messages:
            if producers_done.is_set():
                return
            continue
        for msg in messages:
            if timed_latency:
                ctx.latency(_sent_ts(msg.payload))
            await msg.ack()
            mark()


async def _consumers(ctx: Ctx, q: Any, producers_done: asyncio.Event, timed_latency: bool,
                     mark: Callable[[], None] | None = None, batch: int = 1) -> None:
    await asyncio.gather(*(_consume(ctx, q, producers_done, timed_latency, mark or ctx.mark, batch)
                           for _ in range(ctx.spec["concurrency"])))


class _Tally:
    """Messages consumed outside the timed phase: how many, and when the last one was acked."""

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0

    def mark(self) -> None:
        self.count += 1
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
    await asyncio.to_thread(ctx.go)
    for n in split(ctx.spec["messages"], -(-ctx.spec["messages"] // FILL_CHUNK) or 1):
        await q.push_many([payload(i, ctx.pad) for i in range(n)])
        ctx.mark(n)
    ctx.stop()
    with ctx.tail():
        await q.drain()


async def push(ctx: Ctx, q: Any) -> None:
    await asyncio.to_thread(ctx.go)
    await _produce(ctx, q, ctx.spec["messages"], counted=True)
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
            await _produce(ctx, q, ctx.spec["messages"], counted=False)
        finally:
            done.set()

    await asyncio.to_thread(ctx.go)
    await asyncio.gather(producer(), _consumers(ctx, q, done, timed_latency=True))
    ctx.stop(at_last_mark=True)
    with ctx.tail():
        await q.drain()


async def _with_queue(ctx: Ctx, role: Role) -> None:
    import bucketq  # here, so that a library still being written shows as an error row

    s = ctx.spec
    client: AsyncMongoClient = AsyncMongoClient(s["uri"], event_listeners=[ctx.commands], w=write_concern(s))
    tuned = {"bucket_max_size": s["bucket_max_size"], "bucket_max_wait": s["bucket_max_wait_s"]}
    try:
        if s["role"] == "stream_push":  # the same producer, writing a stream: sequences allocated per write
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
          "stream_push": _sync(push), "push_many": _sync(fill)})

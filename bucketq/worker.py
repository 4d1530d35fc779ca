"""``Worker``: run a handler over a queue with bounded concurrency, in the style of tobox and postqueue.

A per-message handler gets a ``Message``; raising nacks it (backoff, then dead letter after ``max_attempts``).
A batch handler (``batch_size=N``) gets a list of up to N messages and may fail part of it by returning the
failed ones: a mapping ``{message_id: error}`` or an iterable of ``Message``; raising fails the whole batch.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bucketq.errors import InvalidOption, LeaseLost
from bucketq.message import Message
from bucketq.queue import Queue

log = logging.getLogger("bucketq")
RESERVE_WAIT_S = 0.5  # how often an idle task looks at the stop flag


@dataclass(frozen=True)
class BatchTiming:
    """Passed to ``after_batch``: sizes and times of one handled message or batch."""

    size: int
    failed: int
    queue_time_avg_s: float
    queue_time_max_s: float
    processing_s: float


ErrorHook = Callable[[Message, BaseException], Any]
TimingHook = Callable[[BatchTiming], Any]


class Worker:
    def __init__(self, queue: Queue, handler: Callable[..., Awaitable[Any]], *, concurrency: int = 1,
                 batch_size: int | None = None, on_error: ErrorHook | None = None,
                 after_batch: TimingHook | None = None, handle_signals: bool = True) -> None:
        if not inspect.iscoroutinefunction(handler) and not inspect.iscoroutinefunction(
                getattr(handler, "__call__", None)):
            raise InvalidOption("handler must be an async function")
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 1024:
            raise InvalidOption("concurrency must be an int between 1 and 1024")
        if batch_size is not None and (not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000):
            raise InvalidOption("batch_size must be None or an int between 1 and 100000")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.on_error = on_error
        self.after_batch = after_batch
        self.handle_signals = handle_signals
        self._stopping = asyncio.Event()
        self.handled = 0
        self.failed = 0

    def stop(self) -> None:
        """Ask for a graceful stop: running handlers finish, then state is flushed and buckets released."""
        self._stopping.set()

    async def run(self) -> None:
        """Work until ``stop()`` (or SIGTERM/SIGINT), then drain the queue."""
        loop = asyncio.get_running_loop()
        signals = [signal.SIGTERM, signal.SIGINT] if self.handle_signals else []
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        try:
            await asyncio.gather(*(self._loop() for _ in range(self.concurrency)))
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.queue.drain()

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            batch = await self._next_batch()
            if batch:
                await self._handle(batch)

    async def _next_batch(self) -> list[Message]:
        return await self.queue.reserve_many(self.batch_size or 1, timeout=RESERVE_WAIT_S)

    async def _handle(self, batch: list[Message]) -> None:
        started = time.monotonic()
        now = dt.datetime.now(dt.timezone.utc)
        queue_times = [max(0.0, (now - m.enqueued_at).total_seconds()) for m in batch]
        failures: dict[str, BaseException] = {}
        try:
            result = await (self.handler(batch) if self.batch_size else self.handler(batch[0]))
            if self.batch_size and result is not None:
                failures = _failures(result, batch)
        except Exception as exc:
            failures = {m.id: exc for m in batch}
        processing = time.monotonic() - started
        for message in batch:
            error = failures.get(message.id)
            try:
                if message.resolved:  # the handler acked or nacked it itself
                    pass
                elif error is None:
                    await message.ack()
                else:
                    await message.nack(error=error)
            except LeaseLost:
                log.warning("lease lost before message %s was resolved; it will be delivered again", message.id)
            if error is not None:
                await _call_hook(self.on_error, message, error)
        self.handled += len(batch) - len(failures)
        self.failed += len(failures)
        await _call_hook(self.after_batch, BatchTiming(len(batch), len(failures), sum(queue_times) / len(batch),
                                                       max(queue_times), processing))


def _failures(result: Any, batch: list[Message]) -> dict[str, BaseException]:
    if isinstance(result, Mapping):
        return {k.id if isinstance(k, Message) else str(k): v if isinstance(v, BaseException) else RuntimeError(str(v))
                for k, v in result.items()}
    if isinstance(result, Iterable):
        return {m.id: RuntimeError("failed by the batch handler") for m in result}
    raise TypeError(f"a batch handler returns None, a mapping or an iterable of messages, not {type(result).__name__}")


async def _call_hook(hook: Callable[..., Any] | None, *args: Any) -> None:
    if hook is None:
        return
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("worker hook %r failed", hook)

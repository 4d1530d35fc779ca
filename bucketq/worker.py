"""``Worker``: run a handler over a queue with bounded concurrency, in the style of tobox and postqueue.

A per-message handler gets a ``Message``; raising nacks it (backoff, then dead letter after ``max_attempts``).
Raising ``bucketq.Retry(reason, delay=S)`` picks the retry delay; raising ``bucketq.Reject(reason)`` sends the
message straight to the dead letters. A handler may also ack, nack or dead-letter its message itself.
A batch handler (``batch_size=N``) gets a list of up to N messages and may fail part of it by returning the
failed ones: a mapping ``{message_id: error}`` (errors may be ``Retry``/``Reject``) or an iterable of
``Message``; raising fails the whole batch. ``handler_timeout`` bounds each call: a handler past it is
cancelled and its messages are retried with the time limit as the reason.
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

from bucketq import metrics
from bucketq.errors import HandlerTimeout, InvalidOption, LeaseLost, Reject, Retry
from bucketq.message import Message
from bucketq.options import check_delay
from bucketq.queue import Queue

log = logging.getLogger("bucketq")
RESERVE_WAIT_S = 0.5  # how often an idle task looks at the stop flag
DEFAULT_CONCURRENCY = 1  # handler calls at once, unless asked for more: `bucketq worker --concurrency` too


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
    def __init__(self, queue: Queue, handler: Callable[..., Awaitable[Any]], *, concurrency: int = DEFAULT_CONCURRENCY,
                 batch_size: int | None = None, on_error: ErrorHook | None = None,
                 after_batch: TimingHook | None = None, handle_signals: bool = True,
                 handler_timeout: float | None = None) -> None:
        # An object whose __call__ is async counts too; B004 would have callable(), which cannot tell that.
        if not inspect.iscoroutinefunction(handler) and not inspect.iscoroutinefunction(
                getattr(handler, "__call__", None)):  # noqa: B004
            raise InvalidOption("handler must be an async function")
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 1024:
            raise InvalidOption("concurrency must be an int between 1 and 1024")
        if batch_size is not None and (not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000):
            raise InvalidOption("batch_size must be None or an int between 1 and 100000")
        if handler_timeout is not None:
            handler_timeout = check_delay(handler_timeout)
            if handler_timeout <= 0:
                raise InvalidOption("handler_timeout must be None or a positive number of seconds")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.on_error = on_error
        self.after_batch = after_batch
        self.handle_signals = handle_signals
        self.handler_timeout = handler_timeout
        self._stopping = asyncio.Event()
        self.handled = 0
        self.failed = 0
        self._metrics = metrics.for_queue(queue.name, queue.database.name)

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

    async def _call_handler(self, batch: list[Message]) -> Any:
        call = self.handler(batch) if self.batch_size else self.handler(batch[0])
        return await (call if self.handler_timeout is None else _timed(call, self.handler_timeout))

    async def _handle(self, batch: list[Message]) -> None:
        started = time.monotonic()
        now = dt.datetime.now(dt.timezone.utc)
        queue_times = [max(0.0, (now - m.enqueued_at).total_seconds()) for m in batch]
        failures: dict[str, BaseException] = {}
        try:
            result = await self._call_handler(batch)
            if self.batch_size and result is not None:
                failures = _failures(result, batch)
        except Exception as exc:
            failures = {m.id: exc for m in batch}
        processing = time.monotonic() - started
        self._metrics.handled(processing)
        for message in batch:
            error = failures.get(message.id)
            try:
                if message.resolved:  # the handler acked or nacked it itself
                    pass
                elif error is None:
                    await message.ack()
                elif isinstance(error, Reject):
                    await message.dead_letter(error=error)
                else:
                    await message.nack(error.delay if isinstance(error, Retry) else None, error=error)
            except LeaseLost:
                log.warning("lease lost before message %s was resolved; it will be delivered again", message.id)
            if error is not None:
                await _call_hook(self.on_error, message, error)
        self.handled += len(batch) - len(failures)
        self.failed += len(failures)
        await _call_hook(self.after_batch, BatchTiming(len(batch), len(failures), sum(queue_times) / len(batch),
                                                       max(queue_times), processing))


async def _timed(handler: Awaitable[Any], limit: float) -> Any:
    """Await ``handler`` for at most ``limit`` seconds. A handler past its limit is cancelled but not waited
    for (a hung one may never end); its messages are then retried, with the time limit as the reason."""
    task = asyncio.ensure_future(handler)
    done, _ = await asyncio.wait({task}, timeout=limit)
    if not done:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it: retrieve
        raise HandlerTimeout(f"the handler did not finish within {limit:g} s (handler_timeout)")
    return task.result()


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

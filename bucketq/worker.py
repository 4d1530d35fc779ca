"""``Worker``: run a handler over a queue with bounded concurrency, in the style of tobox and postqueue.

A per-message handler gets a ``Message``; raising nacks it (backoff, then dead letter after ``max_attempts``).
Raising ``bucketq.Retry(reason, delay=S)`` picks the retry delay; raising ``bucketq.Reject(reason)`` sends the
message straight to the dead letters. A handler may also ack, nack or dead-letter its message itself.
A batch handler (``batch_size=N``) gets a list of up to N messages and may fail part of it by returning the
failed ones: a mapping ``{message_id: error}`` (errors may be ``Retry``/``Reject``) or an iterable of
``Message``; raising fails the whole batch. ``handler_timeout`` bounds each call: a handler past it is
cancelled and its messages are retried with the time limit as the reason. A message whose cancellation is
requested (``Queue.cancel``) ends as cancelled however its handler ends; with ``cancel_grace``, a handler still
running that many seconds after every message of its call was requested is cancelled (asyncio).

A sync handler (a plain ``def``) runs on a thread of the worker's own, at most ``threads`` at once (by default
``concurrency``), under the same contract: what it returns or raises decides its messages' fate (it does not
call ``ack`` or ``nack``, coroutines of the worker's event loop). A thread cannot be cancelled: a call past
``handler_timeout`` fails its messages as an async one does while it runs on, holding its thread until it
returns; on stop the worker waits for such calls ``drain_timeout`` only (``HandlerThreads``).

Each failed message is logged (a warning with its id, its try, what becomes of it and the traceback), within
a budget per minute. Nothing that goes wrong with one message stops the worker: an error while resolving it is
logged, and the message nacked. On stop, handlers get the queue's ``drain_timeout`` to finish; those still
running are cancelled and waited for before their messages are retried and the queue drains.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bucketq import metrics
from bucketq.core.logbudget import LogBudget
from bucketq.errors import BucketqError, HandlerTimeout, InvalidOption, LeaseLost
from bucketq.message import Message
from bucketq.options import check_delay
from bucketq.queue import Queue, internals
from bucketq.shell.handler_threads import HandlerThreads

log = logging.getLogger("bucketq.worker")
RESERVE_WAIT_S = 0.5  # how often an idle task looks at the stop flag
DEFAULT_CONCURRENCY = 1  # handler calls at once, unless asked for more: `bucketq worker --concurrency` too
# Handler failures are logged one warning each, with the traceback, up to this many per window; beyond that they
# are counted, and summed up in one line when the window ends, so that a failure storm cannot flood the log.
FAILURE_LOG_LIMIT = 10
FAILURE_LOG_WINDOW_S = 60.0


# The handler's say over its message. Here, beside their one user, rather than in bucketq.errors: a Retry checks
# its delay with bucketq.options, which imports bucketq.errors.
class Retry(BucketqError):
    """Raised by a ``Worker`` handler: deliver the message again after ``delay`` seconds (None: the queue's
    backoff), with ``reason`` recorded. It still counts as a try. A ``delay`` that is not a number of seconds
    from 0 to a century (negative, NaN, infinite, a string) raises ``InvalidOption`` here, where it is built."""

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        super().__init__(_check_reason(reason, "Retry") or "retry requested by the handler")
        try:
            self.delay = None if delay is None else check_delay(delay)
        except InvalidOption as exc:
            raise InvalidOption(f"Retry {exc}") from None


class Reject(BucketqError):
    """Raised by a ``Worker`` handler: the message cannot succeed; it goes straight to the dead letters with
    ``reason``, without further tries."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(_check_reason(reason, "Reject") or "rejected by the handler")


def _check_reason(reason: object, kind: str) -> str:
    """``reason`` if it is a str; else ``InvalidOption`` (``Retry(5)`` meant ``Retry(delay=5)``)."""
    if not isinstance(reason, str):
        hint = " (the delay is a keyword: Retry(reason, delay=S))" if kind == "Retry" else ""
        raise InvalidOption(f"{kind} takes a reason str{hint}, got {reason!r}")
    return reason


@dataclass(frozen=True)
class BatchTiming:
    """Passed to ``after_batch``: sizes and times of one handled message or batch. A message's queue time runs
    from its enqueue to its handler's start, by the server's clock (as its enqueue time is stamped)."""

    size: int
    failed: int
    queue_time_avg_s: float
    queue_time_max_s: float
    processing_s: float


ErrorHook = Callable[[Message, BaseException], Any]
TimingHook = Callable[[BatchTiming], Any]


class Worker:
    """Runs ``handler`` on a queue's messages, ``concurrency`` calls at once, until stopped (SIGTERM, SIGINT or
    ``stop()``). ``handler`` is an async function, or a plain ``def`` run on up to ``threads`` threads of the
    worker's own (default ``concurrency``; more leave room for calls past ``handler_timeout`` that have not
    returned yet). A per-message handler takes a ``Message``; with ``batch_size`` it takes a list of them. A return
    acks (a batch handler may return the messages that failed), ``Retry`` picks the retry delay, ``Reject``
    dead-letters at once, any other exception nacks. ``handler_timeout`` cuts off a hung call, ``cancel_grace``
    one that ignores a cancel request; ``on_error`` and ``after_batch`` are hooks. Stopping gives running
    handlers ``drain_timeout``, cancels the rest and waits for them before the queue drains."""

    def __init__(self, queue: Queue, handler: Callable[..., Any], *, concurrency: int = DEFAULT_CONCURRENCY,
                 batch_size: int | None = None, on_error: ErrorHook | None = None,
                 after_batch: TimingHook | None = None, handle_signals: bool = True,
                 handler_timeout: float | None = None, cancel_grace: float | None = None,
                 threads: int | None = None) -> None:
        if not callable(handler):
            raise InvalidOption(f"handler must be a function (async, or sync: run on threads), got {handler!r}")
        # An object whose __call__ is async counts too; B004 would have callable(), which cannot tell that.
        is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None))  # noqa: B004
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 1024:
            raise InvalidOption("concurrency must be an int between 1 and 1024")
        if threads is not None and is_async:
            raise InvalidOption("threads is for a sync handler; an async handler runs on the event loop")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)
                                    or not 1 <= threads <= 1024):
            raise InvalidOption(f"threads must be None (as many as concurrency) or an int between 1 and 1024, "
                                f"got {threads!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000):
            raise InvalidOption("batch_size must be None or an int between 1 and 100000")
        if cancel_grace is not None:  # 0 is allowed: cut off as soon as the cancellation is heard of
            cancel_grace = check_delay(cancel_grace)
        if handler_timeout is not None:
            handler_timeout = check_delay(handler_timeout)
            if handler_timeout <= 0:
                raise InvalidOption("handler_timeout must be None or a positive number of seconds")
        self.queue = queue
        self._clock = internals(queue).clock
        self.handler = handler
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.on_error = on_error
        self.after_batch = after_batch
        self.handle_signals = handle_signals
        self.handler_timeout = handler_timeout
        self.cancel_grace = cancel_grace
        self.handler_threads = None if is_async else HandlerThreads(threads or concurrency)
        self._stopping = asyncio.Event()
        self.handled = 0
        self.failed = 0
        self._calls: set[asyncio.Future[Any]] = set()  # the handler calls running
        self._cut_off = False  # stop() waited drain_timeout, then cancelled the handler calls still running
        self._failure_log = LogBudget(FAILURE_LOG_LIMIT, FAILURE_LOG_WINDOW_S)
        self._metrics = metrics.for_queue(queue.name, queue.database.name)

    def stop(self) -> None:
        """Ask for a graceful stop: running handlers get ``drain_timeout`` to finish (then they are cancelled),
        then state is flushed and buckets released."""
        self._stopping.set()

    async def run(self) -> None:
        """Work until ``stop()`` (or SIGTERM/SIGINT), then drain the queue."""
        loop = asyncio.get_running_loop()
        signals = [signal.SIGTERM, signal.SIGINT] if self.handle_signals else []
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        try:
            await self._serve()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            self._log_suppressed(force=True)
            if self.handler_threads is not None:
                self.handler_threads.close()
            await self.queue.drain()

    async def _serve(self) -> None:
        """Run the loops until ``stop()`` (or one of them fails). Handlers still running ``drain_timeout``
        seconds later are cancelled, and waited for: their messages are retried only once they returned, and
        the queue drains after that, so no other consumer gets a message while its handler here still runs."""
        loops = [asyncio.ensure_future(self._loop()) for _ in range(self.concurrency)]
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([*loops, stopping], return_when=asyncio.FIRST_COMPLETED)
            self.stop()  # a loop that ended before stop() failed: stop the others too
            drain_timeout = self.queue.options.drain_timeout
            _, running = await asyncio.wait(loops, timeout=drain_timeout)
            if running:
                self._cut_off = True  # from now on, a handler call is cancelled as it starts
                if self._calls:
                    log.warning("%d handler call(s) still running %g s after the worker began stopping "
                                "(drain_timeout): cancelling them, and waiting for them to return",
                                len(self._calls), drain_timeout)
                for call in list(self._calls):
                    call.cancel()
                await asyncio.wait(loops)
        finally:
            for task in (*loops, stopping):
                task.cancel()
            await asyncio.gather(*loops, stopping, return_exceptions=True)
        for task in loops:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _loop(self) -> None:
        threads = self.handler_threads
        while not self._stopping.is_set():
            self._log_suppressed()
            # a sync handler's thread first, so that no message is reserved to wait for one
            if threads is not None and not await threads.take(RESERVE_WAIT_S):
                continue  # every thread busy (some with calls past their timeout): look at the stop flag again
            try:
                batch = await self._next_batch()
            except BaseException:
                if threads is not None:
                    threads.give_back()
                raise
            if batch:
                await self._handle(batch)  # which runs the sync call in the slot taken (given back on return)
            elif threads is not None:
                threads.give_back()

    async def _next_batch(self) -> list[Message]:
        return await self.queue.reserve_many(self.batch_size or 1, timeout=RESERVE_WAIT_S)

    async def _call_handler(self, batch: list[Message]) -> Any:
        """The handler's result. A call past ``handler_timeout`` is cancelled but not waited for (a hung one
        may never end); one cancelled on stop (``_serve``) was waited for. Both raise ``HandlerTimeout``."""
        argument = batch if self.batch_size else batch[0]
        call = asyncio.ensure_future(self.handler(argument)) if self.handler_threads is None else \
            self.handler_threads.run(self.handler, argument)
        self._calls.add(call)
        if self._cut_off:  # a batch reserved after the cut-off
            call.cancel()
        cutter = None if self.cancel_grace is None else asyncio.ensure_future(self._cut_when_cancelled(batch, call))
        try:
            done, _ = await asyncio.wait({call}, timeout=self.handler_timeout)
        except asyncio.CancelledError:  # the worker itself is cancelled: so is its handler, which it waits for
            call.cancel()
            await asyncio.wait({call})
            raise
        finally:
            self._calls.discard(call)
            if cutter is not None:
                cutter.cancel()
        if not done:
            call.cancel()
            call.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it: retrieve
            raise HandlerTimeout(f"the handler did not finish within {self.handler_timeout:g} s (handler_timeout)")
        if call.cancelled() and self._cut_off:
            raise HandlerTimeout(f"the worker stopped and the handler did not finish within "
                                 f"{self.queue.options.drain_timeout:g} s (drain_timeout)")
        if call.cancelled() and self.cancel_grace is not None and all(m.cancelled for m in batch):
            raise RuntimeError(f"the handler was cancelled {self.cancel_grace:g} s after the cancellation of its "
                               "message(s) was requested (cancel_grace)")
        if call.cancelled():
            raise RuntimeError("the handler was cancelled")
        return call.result()

    async def _cut_when_cancelled(self, batch: list[Message], call: asyncio.Future[Any]) -> None:
        """Cancel the handler's ``call`` ``cancel_grace`` seconds after every message of it was requested to be
        cancelled (``Queue.cancel``): for handlers that do not watch ``message.cancelled``."""
        await asyncio.gather(*(m.wait_cancelled() for m in batch))
        await asyncio.sleep(self.cancel_grace or 0.0)
        call.cancel()

    async def _handle(self, batch: list[Message]) -> None:
        started = time.monotonic()
        now = self._clock.now()  # enqueue times are the server's: so is the time they are measured to
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
                fate = await self._resolve(message, error)
            except Exception as exc:  # e.g. the dedupe key's write failed: the message must come back
                log.exception("resolving message %s failed", message.id)
                error = failures[message.id] = exc
                fate = await self._retry_unresolved(message, exc)
            if error is not None:
                self._log_failure(message, error, fate)
                await _call_hook(self.on_error, message, error)
        self.handled += len(batch) - len(failures)
        self.failed += len(failures)
        await _call_hook(self.after_batch, BatchTiming(len(batch), len(failures), sum(queue_times) / len(batch),
                                                       max(queue_times), processing))

    async def _resolve(self, message: Message, error: BaseException | None) -> str:
        """Ack, nack or dead-letter ``message`` as its handler's outcome says; what became of it, in words."""
        try:
            if message.resolved:
                return "the handler resolved it itself"
            if message.cancelled:  # whatever the handler made of it: recorded as cancelled (``Queue.cancel``)
                await message.dead_letter()
                return "cancelled (Queue.cancel)"
            if error is None:
                await message.ack()
                return "acked"
            if isinstance(error, Reject):
                await message.dead_letter(error=error)
                return "dead-lettered: rejected by the handler"
            retry_in = await message.nack(error.delay if isinstance(error, Retry) else None, error=error)
        except LeaseLost:
            log.warning("lease lost before message %s was resolved; it will be delivered again", message.id)
            return "lease lost: it will be delivered again"
        return _fate(retry_in, self.queue.options.max_attempts)

    async def _retry_unresolved(self, message: Message, error: BaseException) -> str:
        """After ``_resolve`` failed: nack the message with the queue's backoff, if it is still in hand."""
        if message.resolved:
            return "resolved before the error"
        try:
            return _fate(await message.nack(error=error), self.queue.options.max_attempts)
        except Exception as exc:
            log.warning("nack of message %s failed too (%s); it is retried when the worker drains", message.id, exc)
            return "left in hand: it is retried when the worker drains"

    def _log_failure(self, message: Message, error: BaseException, fate: str) -> None:
        """One warning with the traceback per failed message, at most ``FAILURE_LOG_LIMIT`` per window."""
        self._log_suppressed()
        if self._failure_log.take(time.monotonic()):
            log.warning("handler failed on message %s (try %d of %d): %s", message.id, message.tries + 1,
                        self.queue.options.max_attempts, fate, exc_info=error)

    def _log_suppressed(self, *, force: bool = False) -> None:
        closed = self._failure_log.close(time.monotonic(), force=force)
        if closed is not None:
            log.warning("%d more handler failures suppressed in the last %.0f s (at most %d are logged per %.0f s)",
                        closed[0], closed[1], FAILURE_LOG_LIMIT, FAILURE_LOG_WINDOW_S)


def _fate(retry_in: float | None, max_attempts: int) -> str:
    """What a nack did, in words: see ``Message.nack``."""
    if retry_in is None:
        return f"dead-lettered: max_attempts ({max_attempts}) reached"
    return f"will retry in {retry_in:.1f} s"


def _failures(result: Any, batch: list[Message]) -> dict[str, BaseException]:
    """The failed messages of ``batch`` that a batch handler returned, by id (ids not in the batch ignored)."""
    ids = {m.id for m in batch}
    if isinstance(result, Mapping):
        failed = {k.id if isinstance(k, Message) else str(k): v if isinstance(v, BaseException)
                  else RuntimeError(str(v)) for k, v in result.items()}
        return {k: v for k, v in failed.items() if k in ids}
    if isinstance(result, Iterable):
        return {m.id: RuntimeError("failed by the batch handler") for m in result if m.id in ids}
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

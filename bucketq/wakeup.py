"""Waking idle consumers: a local signal (pushes from the same queue object, retry buckets this consumer
wrote) plus, where the server supports them, change-stream insert events; otherwise polling that backs off."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from bucketq.clock import ServerClock
from bucketq.store.aio.base import raise_if_cancelled

log = logging.getLogger("bucketq")

POLL_FIRST_S = 0.01
# With a change stream, polling only catches leases that expired and buckets released by other consumers.
POLL_WITH_STREAM_S = 1.0
# Some servers (the test server among them) answer an empty change-stream getMore at once instead of waiting
# maxAwaitTimeMS; an empty answer that came back this fast is followed by this pause, not by a busy loop.
STREAM_QUICK_EMPTY_S = 0.01
STREAM_PAUSE_S = 0.04


class Wakeup:
    def __init__(self, poll_interval: float) -> None:
        self._event = asyncio.Event()
        self._poll_cap = poll_interval
        self._next_poll = POLL_FIRST_S
        self.streaming = False
        self._ever_streamed = False
        self._task: asyncio.Task[None] | None = None

    def notify(self) -> None:
        self._event.set()
        self._next_poll = POLL_FIRST_S

    def hit(self) -> None:
        """A claim found work: poll eagerly again next time."""
        self._next_poll = POLL_FIRST_S

    async def wait(self, limit: float) -> None:
        """Sleep until notified, the poll delay passes, or ``limit`` seconds, whichever is first."""
        cap = POLL_WITH_STREAM_S if self.streaming else self._poll_cap
        delay = min(limit, self._next_poll)
        self._next_poll = min(cap, self._next_poll * 2)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), delay)
        self._event.clear()

    def start_stream(self, watch: Callable[[Timestamp], Awaitable[Any]], clock: ServerClock, required: bool) -> None:
        """Start watching (``watch``: a store's method that opens the change stream from a cluster time), or start
        again after a stream that worked was lost (a server restart)."""
        if self._task is None or (self._task.done() and self._ever_streamed):
            self._task = asyncio.get_running_loop().create_task(self._watch(watch, clock, required),
                                                                name="bucketq-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.streaming = False

    async def _watch(self, watch: Callable[[Timestamp], Awaitable[Any]], clock: ServerClock, required: bool) -> None:
        # startAtOperationTime spares a server round trip and is needed by servers (such as the test server)
        # that leave operationTime out of their replies; a second back covers a small clock error.
        start = Timestamp(int(clock.now().timestamp()) - 1, 0)
        try:
            stream = await watch(start)
            try:
                while True:
                    asked = time.monotonic()
                    event = await stream.try_next()
                    raise_if_cancelled()  # a cancel the driver swallowed: stop() waits for this task
                    self.streaming = self._ever_streamed = True
                    if event is not None:
                        self.notify()
                    elif time.monotonic() - asked < STREAM_QUICK_EMPTY_S:
                        await asyncio.sleep(STREAM_PAUSE_S)
            finally:
                await stream.close()
        except PyMongoError as exc:
            self.streaming = False
            (log.warning if required else log.debug)("change streams unavailable, polling instead: %s", exc)

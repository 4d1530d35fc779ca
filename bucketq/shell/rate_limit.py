"""A consumer's permits under its queue's rate limit (``core.rate_limit``): asked for from the shared counter of the
current window in chunks, spent one a message, forgotten when their window ends."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from pymongo.errors import PyMongoError

from bucketq.core import rate_limit
from bucketq.core.rate_limit import RateLimit
from bucketq.shell.clock import ServerClock
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")

# The longest a wait for the next window sleeps in one go: a drain ends it within this.
WAIT_SLICE_S = 0.25


class Permits:
    def __init__(self, store: AsyncQueueStore, clock: ServerClock) -> None:
        self._store = store
        self._clock = clock
        self._window: dt.datetime | None = None
        self._left = 0  # permits of ``_window`` at hand
        self._spent = False  # ``_window`` granted nothing more: wait for the next one

    @property
    def unlimited(self) -> bool:
        """Whether the queue has no rate limit (learned at set-up): its messages are served without permits."""
        return self._store.rate_limit is None

    @property
    def limit(self) -> RateLimit:
        """The queue's rate limit, learned at set-up (``AsyncQueueStore.rate_limit``)."""
        limit = self._store.rate_limit
        assert limit is not None, "permits are asked for only under a rate limit"
        return limit

    async def take(self, wanted: int) -> int:
        """Up to ``wanted`` permits of the current window, without waiting: those at hand, else one ask of the
        shared counter (none once the window is spent)."""
        window = self.limit.window(self._clock.now())
        if window != self._window:
            self._window, self._left, self._spent = window, 0, False
        if not self._left and not self._spent:
            k = self.limit.chunk(wanted)
            counter = await self._store.ask_permits(window, k)
            self._left = rate_limit.granted(counter, k, self.limit.limit)
            self._spent = self._left < k
            if rate_limit.first_ask(counter, k):  # once a window, by the consumer that opened it
                await self._reap(window)
        got = min(wanted, self._left)
        self._left -= got
        return got

    def give_back(self, n: int) -> None:
        """Permits taken and not spent: kept for this consumer's next messages in the same window."""
        if self._window is not None and self._window == self.limit.window(self._clock.now()):
            self._left += n

    async def wait_for_one(self, deadline: float | None, stopped: Callable[[], bool]) -> bool:
        """Take one permit, waiting for the next window while this one is spent; False when ``deadline``
        (monotonic) passes first or ``stopped()`` turns true."""
        while not stopped():
            if await self.take(1):
                return True
            assert self._window is not None
            # Past its end already when the ask's answer came late: take again at once, from the next window
            wait = (self.limit.window_end(self._window) - self._clock.now()).total_seconds()
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait = min(wait, left)
            await asyncio.sleep(min(max(wait, 0.001), WAIT_SLICE_S))
        return False

    async def _reap(self, window: dt.datetime) -> None:
        try:
            await self._store.reap_windows(window, self.limit)
        except PyMongoError as exc:  # the next window's first ask tries again
            log.warning("could not delete old rate-limit windows: %s", exc)

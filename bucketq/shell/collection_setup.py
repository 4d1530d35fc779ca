"""The set-up a queue or stream needs before use: the server clock measured (again every few minutes) and, before
the first write, its indexes created. Read-only callers create nothing, so reads leave a database as it was.
Concurrent callers share one set-up and all resume together: pushes made while it runs still reach the producer in
one burst and share buckets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pymongo.errors import PyMongoError

from bucketq.shell.clock import ServerClock
from bucketq.shell.connection import Connection, reaching
from bucketq.shell.redaction import redact
from bucketq.store.aio.base import raise_if_cancelled, retrying

log = logging.getLogger("bucketq")


class SetUp:
    def __init__(self, connection: Connection, clock: ServerClock, ensure_indexes: Callable[[], Awaitable[None]],
                 timeout_s: float) -> None:
        self._connection = connection
        self._clock = clock
        self._ensure_indexes = ensure_indexes
        self._timeout_s = timeout_s
        self.indexed = False
        self._running: asyncio.Future[None] | None = None

    def pending(self, *, write: bool = True) -> bool:
        """Whether ``ready`` has anything to do: a push awaits it only then (a coroutine a push costs a microsecond)."""
        return self._clock.stale or (write and not self.indexed)

    async def ready(self, *, write: bool = True) -> None:
        while self.pending(write=write):
            if self._running is None or self._running.done():
                self._running = asyncio.ensure_future(self._set_up(write))
            await asyncio.shield(self._running)

    async def _set_up(self, write: bool) -> None:
        if self._clock.stale:
            database = self._connection.database
            await self._retrying("reading the server clock", lambda: self._clock.sync(database, self._timeout_s))
        if write and not self.indexed:
            await self._retrying("creating the indexes", self._ensure_indexes)
            self.indexed = True

    async def _retrying(self, what: str, op: Callable[[], Awaitable[Any]]) -> None:
        """``op`` retried up to ``timeout_s``; a server that never answered raises ``ServerUnreachable``."""
        with reaching(self._connection.uri, what, f"write_timeout {self._timeout_s:g} s",
                      self._connection.database.client):
            await retrying(lambda _: op(), timeout_s=self._timeout_s)


async def every(period_s: float, work: Callable[[], Awaitable[Any]], what: str) -> None:
    """Run ``work`` now and every ``period_s`` seconds until cancelled (housekeeping); a server error is logged
    and tried again next time. A cancel swallowed by the driver during ``work`` still stops the loop."""
    while True:
        try:
            await work()
        except PyMongoError as exc:
            log.warning("%s failed, will retry: %s", what, redact(str(exc)))
        raise_if_cancelled()
        await asyncio.sleep(period_s)


async def stop(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (an ``every`` loop) and wait until it has ended."""
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

"""Pipelined pushing: many pushes in flight at once, in order, with a bounded window of pending ids."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from bucketq.errors import BufferFull, WriteFailed
from bucketq.queue import Queue

WINDOW = 8192  # pending pushes before waiting for the oldest; several buckets' worth


class Pusher:
    def __init__(self, queue: Queue, *, delay: float | None = None) -> None:
        self._queue = queue
        self._delay = delay
        self._pending: deque[asyncio.Future[str]] = deque()
        self.stored = 0
        self.failed = 0
        self.first_error: BaseException | None = None

    async def push(self, payload: Any) -> None:
        """Buffer one payload (``EncodeError``/``PayloadTooLarge`` raise here); waits only to bound the window."""
        while True:
            try:
                future = self._queue.push_nowait(payload, delay=self._delay)
                break
            except BufferFull:
                if not self._pending:
                    future = asyncio.ensure_future(self._queue.push(payload, delay=self._delay))
                    break
                await self._settle(self._pending.popleft())
        self._pending.append(future)
        while len(self._pending) > WINDOW:
            await self._settle(self._pending.popleft())

    async def finish(self) -> None:
        """Write what is buffered and wait for every push."""
        await self._queue.flush()
        while self._pending:
            await self._settle(self._pending.popleft())

    async def _settle(self, future: asyncio.Future[str]) -> None:
        try:
            await future
            self.stored += 1
        except WriteFailed as exc:
            self.failed += 1
            self.first_error = self.first_error or exc

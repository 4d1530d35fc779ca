"""``KeyRecorder``: the dedupe keys of acked messages, written to the inbox before their acks return."""

from __future__ import annotations

import asyncio

from bucketq.shell.clock import ServerClock
from bucketq.store.aio.queue_store import AsyncQueueStore


class KeyRecorder:
    """Writes dedupe keys to the inbox, one insert in flight at a time: keys acked meanwhile share the next."""

    def __init__(self, store: AsyncQueueStore, clock: ServerClock) -> None:
        self._store = store
        self._clock = clock
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def record(self, key: str) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write())
        await future

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._store.record_keys([k for k, _ in batch], self._clock.now())
            except Exception as exc:
                for _, future in batch:
                    future.set_exception(exc)
            else:
                for _, future in batch:
                    future.set_result(None)
        self._task = None

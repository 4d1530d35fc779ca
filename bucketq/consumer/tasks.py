"""``BackgroundTasks``: the consumer's tasks that no caller awaits (flushes, the claim ahead, gathered finishes),
kept referenced while they run so that a drain can wait for them, then cancel them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class BackgroundTasks:
    """The tasks under way that a drain waits for: each is dropped once done."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of its own, kept until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def running(self) -> list[asyncio.Task[Any]]:
        """The tasks under way now."""
        return list(self._running)

"""``Lifecycle``: what a ``Queue`` and a ``Stream`` share between open and close: calls refused once closed,
set-up before use (``collection_setup.SetUp``), one housekeeping task, and the close sequence (drain, then stop the rest
even when the drain failed)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from bucketq.errors import QueueClosed
from bucketq.shell.collection_setup import SetUp, every, stop


class Lifecycle:
    """The open/closed state of a queue or stream (``what``, for the error), set up by ``collection_setup``."""

    def __init__(self, what: str, setup: SetUp) -> None:
        self._what = what
        self.setup = setup
        self.housekeeping: asyncio.Task[None] | None = None
        self.closed = False

    async def ready(self, *, write: bool = True) -> None:
        """Set up before use (``shell.collection_setup``): the server clock, and the indexes before the first write."""
        if self.closed:
            raise QueueClosed(f"the {self._what} is closed")
        await self.setup.ready(write=write)

    def pending(self) -> bool:
        """Whether ``ready`` still has set-up to do."""
        return self.setup.pending()

    def keep_house(self, period_s: float, work: Callable[[], Awaitable[Any]], what: str, name: str) -> None:
        """Start the housekeeping task (``collection_setup.every``) unless it runs already."""
        if self.housekeeping is None:
            self.housekeeping = asyncio.get_running_loop().create_task(every(period_s, work, what), name=name)

    async def close(self, drain: Callable[[], Awaitable[None]], *then: Callable[[], Awaitable[Any]]) -> None:
        """Once: ``drain``, then, even if it failed, stop housekeeping and run ``then`` in order."""
        if self.closed:
            return
        try:
            await drain()
        finally:
            self.closed = True
            await stop(self.housekeeping)
            for step in then:
                await step()

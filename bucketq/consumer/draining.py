"""The consumer's orderly stop: no more claims, served messages waited for, held buckets flushed and released."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bucketq.consumer.finishing import Finishes
from bucketq.consumer.flushing import Flushing
from bucketq.consumer.holding import Holding
from bucketq.consumer.tasks import BackgroundTasks
from bucketq.errors import WriteFailed
from bucketq.options import QueueOptions
from bucketq.shell.clock import ServerClock


class Draining:
    """Drains a consumer: waits for its claims under way (``claims_landed``) and for the messages served of the
    buckets in ``holdings``, then releases those through ``flushing``, after the finishes gathered in ``finishes``;
    waits for ``background``'s tasks, then cancels them."""

    def __init__(self, options: QueueOptions, clock: ServerClock, holdings: list[Holding], *, finishes: Finishes,
                 flushing: Flushing, background: BackgroundTasks,
                 claims_landed: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._options = options
        self._clock = clock
        self._holdings = holdings
        self._finishes = finishes
        self._flushing = flushing
        self._background = background
        self._claims_landed = claims_landed

    async def drain(self) -> None:
        """Once the consumer stopped claiming (``Consumer.drain``): wait for the claims under way and (up to
        ``drain_timeout``) for served messages, flush, and release held buckets, all at once, so that their
        unserved messages are claimable at once by others, with no tries added. Returns within ``drain_timeout``
        plus one ``write_timeout`` whatever the server does: a claim or a release it has not answered by then is
        abandoned (those buckets come back when their leases expire) and ``WriteFailed`` is raised. Background
        tasks stop even when a write fails (the server is unreachable)."""
        self._finishes.write_now()  # the finishes waiting for others: written before the releases
        started = time.monotonic()
        stop_by = started + self._options.drain_timeout + self._options.write_timeout
        try:
            # A claim already under way lands in self._holdings, to be released.
            claiming = self._background.spawn(self._claims_landed())
            await asyncio.wait([claiming], timeout=stop_by - time.monotonic())
            deadline = started + self._options.drain_timeout
            while any(h.held.outstanding for h in self._holdings if not h.held.ended) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            now = self._clock.now()
            releases = []
            for holding in list(self._holdings):
                held = holding.held
                if held.ended:
                    continue
                # handlers that did not finish in time: retried, with a try counted
                held.give_back(now, "not resolved before the consumer drained")
                releases.append(self._background.spawn(self._flushing.flush(holding, release=not held.finished)))
            if background := self._background.running():
                await asyncio.wait(background, timeout=max(0.0, stop_by - time.monotonic()))
            for task in releases:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            unanswered = sum(not task.done() for task in [claiming, *releases])
            if unanswered:
                raise WriteFailed(f"drain: {unanswered} claim(s) or release(s) unanswered by the server within "
                                  "drain_timeout + write_timeout; their buckets come back when their leases expire")
        finally:
            flush_loop = self._flushing.stop()
            tasks = [*self._background.running(), *([flush_loop] if flush_loop else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

"""The consumer's orderly stop: no more claims, served messages waited for, held buckets flushed and released."""

from __future__ import annotations

import asyncio
import time

from bucketq.consumer.state import ConsumerState
from bucketq.errors import WriteFailed


class Draining(ConsumerState):
    async def drain(self) -> None:
        """Stop claiming, wait (up to ``drain_timeout``) for served messages, flush, and release held buckets,
        all at once, so that their unserved messages are claimable at once by others, with no tries added.
        Returns within ``drain_timeout`` plus one ``write_timeout`` whatever the server does: a claim or a
        release it has not answered by then is abandoned (those buckets come back when their leases expire)
        and ``WriteFailed`` is raised. Background tasks stop even when a write fails (the server is
        unreachable)."""
        self._draining = True
        self._wakeup.notify()
        self._finishes.write_now()  # the finishes waiting for others: written before the releases
        started = time.monotonic()
        stop_by = started + self._options.drain_timeout + self._options.write_timeout
        try:
            # A claim already under way lands in self._holdings, to be released.
            claiming = self._spawn(self._claims_landed())
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
                releases.append(self._spawn(self._flush(holding, release=not held.finished)))
            if self._background:
                await asyncio.wait(list(self._background), timeout=max(0.0, stop_by - time.monotonic()))
            for task in releases:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            unanswered = sum(not task.done() for task in [claiming, *releases])
            if unanswered:
                raise WriteFailed(f"drain: {unanswered} claim(s) or release(s) unanswered by the server within "
                                  "drain_timeout + write_timeout; their buckets come back when their leases expire")
        finally:
            tasks = [*self._background, *([self._flusher] if self._flusher else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._flusher = None

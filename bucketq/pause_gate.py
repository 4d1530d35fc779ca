"""The pause gate that consumers consult before each claim (``Queue.pause``, ``bucketq pause``): the queue's
``Q.control`` document, read at most once a ``PAUSE_REFRESH_S``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

# A consumer reads the pause document at most this often, so it stops claiming within this many seconds of a
# pause (plus one round trip); a paused one reads it again this often (no event tells of a resume), so it
# starts again within this many seconds of a resume (plus one round trip).
PAUSE_REFRESH_S = 1.0


class PauseGate:
    """Whether the queue is paused, as its ``Q.control`` document says (``read``: the store's
    ``read_pause``), read again once ``refresh_s`` has passed since the last read: one small read a second per
    consumer, not one per claim."""

    def __init__(self, read: Callable[[], Awaitable[bool]], refresh_s: float = PAUSE_REFRESH_S) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._paused = False
        self._read_at = float("-inf")

    async def holds(self) -> bool:
        """True while the queue is paused (as last read): the caller must not claim a bucket."""
        if time.monotonic() - self._read_at >= self._refresh_s:
            self.set(await self._read())
        return self._paused

    def set(self, paused: bool) -> None:
        """What this process just wrote or read: in effect at once, without waiting for the next read."""
        self._paused = paused
        self._read_at = time.monotonic()

"""The pause gate that consumers consult before each claim (``Queue.pause``, ``bucketq pause``): the queue's
``Q.control`` document, read at most once a ``PAUSE_REFRESH_S``, or with a change stream on ``Q.control``
only after each write it announces (``PauseGate.changed``) and once after the stream opened."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

# Without a change stream, a consumer reads the pause document at most this often, so it stops claiming within
# this many seconds of a pause (plus one round trip); a paused one reads it again this often, so it starts
# again within this many seconds of a resume (plus one round trip). With one, a pause or resume announces
# itself (``PauseGate.changed``), and the document is read only after such an event: an idle consumer reads
# nothing. A stream lost (a server restart) or silent (``wakeup.STREAM_SILENT_S``) ends the watching, and the
# reads once a second come back until a new stream opens (after which the document is read once more).
PAUSE_REFRESH_S = 1.0


class PauseGate:
    """Whether the queue is paused, as its ``Q.control`` document says (``read``: the store's
    ``read_pause``), read again once ``refresh_s`` has passed since the last read: one small read a second per
    consumer, not one per claim."""

    def __init__(self, read: Callable[[], Awaitable[bool]], refresh_s: float = PAUSE_REFRESH_S) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._paused = False
        self._read_at: float | None = None  # monotonic time of the last read; None: read before the next claim

    async def holds(self, *, watched: bool = False) -> bool:
        """True while the queue is paused (as last read): the caller must not claim a bucket. ``watched``: a
        change stream announces every write of the pause document (``changed``), so what was read holds until
        one does."""
        if self._read_at is None or (not watched and time.monotonic() - self._read_at >= self._refresh_s):
            self.set(await self._read())
        return self._paused

    def changed(self) -> None:
        """The pause document was written (a change-stream event), or a stream on it opened (what was read
        before may be older than the stream's first event): read it before the next claim."""
        self._read_at = None

    def set(self, paused: bool) -> None:
        """What this process just wrote or read: in effect at once, without waiting for the next read."""
        self._paused = paused
        self._read_at = time.monotonic()

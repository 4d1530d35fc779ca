"""The server's clock, as seen from this host.

Due times and leases are compared against ``now()``: the server's ``isMaster.localTime`` measured at the
last sync (error: half a round trip plus 1 ms), advanced by this host's *monotonic* clock since then. The
host's wall clock is never read, so an NTP step or a manual change of it cannot make fresh leases look
expired (or eternal); all hosts agree on time within a few milliseconds even when their own clocks are
skewed. See docs/FORMAT.md.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from bucketq.core.format import UTC, as_utc

RESYNC_EVERY_S = 300.0


def anchor(sent_mono: float, received_mono: float, server_time: Any) -> tuple[float, float] | None:
    """``(server seconds since the epoch, monotonic seconds)`` at the same instant, from one round trip sent
    and received at the given monotonic times; None when the reply carries no server time."""
    if not isinstance(server_time, dt.datetime):
        return None
    return as_utc(server_time).timestamp(), (sent_mono + received_mono) / 2


class ServerClock:
    def __init__(self) -> None:
        # Until the first sync: this host's wall clock, read once, then advanced monotonically.
        self._server_s = time.time()
        self._mono_s = time.monotonic()
        self._synced_at: float | None = None
        # The last reading, as (millisecond, datetime): a busy consumer reads the clock once a message, and one
        # datetime a millisecond is all it needs. One attribute, so that threads never pair a stale datetime
        # with a fresh millisecond.
        self._last: tuple[int, dt.datetime] = (-1, dt.datetime.fromtimestamp(0, UTC))

    def now(self) -> dt.datetime:
        # BSON dates have millisecond precision: truncate here so what we compare is what is stored.
        ms = int((self._server_s + (time.monotonic() - self._mono_s)) * 1000)
        last = self._last
        if last[0] != ms:
            last = self._last = (ms, dt.datetime.fromtimestamp(ms / 1000, UTC))
        return last[1]

    @property
    def stale(self) -> bool:
        return self._synced_at is None or time.monotonic() - self._synced_at > RESYNC_EVERY_S

    async def sync(self, database: Any) -> None:
        """Measure the server clock with one ``isMaster`` round trip (async clients)."""
        sent = time.monotonic()
        reply = await database.client.admin.command("isMaster")
        self._take(sent, time.monotonic(), reply)

    def sync_blocking(self, client: Any) -> None:
        """The same for a synchronous ``MongoClient`` (the Spark driver's shell)."""
        sent = time.monotonic()
        reply = client.admin.command("isMaster")
        self._take(sent, time.monotonic(), reply)

    def _take(self, sent: float, received: float, reply: Any) -> None:
        point = anchor(sent, received, reply.get("localTime"))
        if point is not None:
            self._server_s, self._mono_s = point
        self._synced_at = time.monotonic()

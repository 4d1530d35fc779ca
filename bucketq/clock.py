"""The server's clock, as seen from this host.

Due times and leases are compared against ``now()``, which is this host's UTC clock corrected by the offset
to the server's clock measured from ``isMaster.localTime`` (error: half a round trip plus 1 ms). All hosts
thus agree on time within a few milliseconds even when their own clocks are skewed; see docs/FORMAT.md.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from bucketq.core.format import UTC, as_utc

RESYNC_EVERY_S = 300.0


class ServerClock:
    def __init__(self) -> None:
        self.offset_s = 0.0
        self._synced_at: float | None = None

    def now(self) -> dt.datetime:
        # BSON dates have millisecond precision: truncate here so what we compare is what is stored.
        return dt.datetime.fromtimestamp(int((time.time() + self.offset_s) * 1000) / 1000, UTC)

    @property
    def stale(self) -> bool:
        return self._synced_at is None or time.monotonic() - self._synced_at > RESYNC_EVERY_S

    async def sync(self, database: Any) -> None:
        """Measure the offset to the server clock with one ``isMaster`` round trip."""
        before = time.time()
        reply = await database.client.admin.command("isMaster")
        after = time.time()
        server = reply.get("localTime")
        if isinstance(server, dt.datetime):
            self.offset_s = as_utc(server).timestamp() - (before + after) / 2
        self._synced_at = time.monotonic()

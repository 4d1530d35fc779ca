"""The documents of a queue's collection that no claim can take (``core.strays``): broken buckets moved to
quarantine by housekeeping, at most every ``SWEEP_EVERY_S`` (the look is a scan of the collection), and the others
reported, as not buckets, to ``stats()``, ``bucketq peek`` and the dashboard."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from bucketq.core import claims, strays
from bucketq.core.format import quarantined_bucket
from bucketq.shell.clock import ServerClock
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")

SWEEP_EVERY_S = 600.0  # between a consumer's scans for broken buckets (a housekeeping round, at most this often)
SWEEP_CHUNK = 100  # broken buckets moved per scan; more wait for the next one


class Strays:
    def __init__(self, store: AsyncQueueStore, clock: ServerClock) -> None:
        self._store = store
        self._clock = clock
        self._next_sweep = 0.0  # monotonic time of the next sweep: the first housekeeping round makes one

    async def sweep(self) -> int:
        """Move up to ``SWEEP_CHUNK`` broken buckets no claim can take to quarantine, with the reason, unless the
        last sweep was less than ``SWEEP_EVERY_S`` ago; how many moved."""
        if time.monotonic() < self._next_sweep:
            return 0
        docs = await self._store.strays(broken=True, limit=SWEEP_CHUNK)
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S  # once the scan got through: a failed one is retried
        if not docs:
            return 0
        partitions = await self._store.partition_count()
        now, host = self._clock.now(), claims.owner_name().split(":")[0]
        entries = [quarantined_bucket(doc, reason=strays.reason(doc, partitions), at=now, host=host, pid=os.getpid())
                   for doc in docs]
        moved = await self._store.quarantine_strays(entries, docs)
        for entry in entries:
            log.warning("bucket %s quarantined: %s", entry["_id"], entry["reason"])
        return moved

    async def report(self, limit: int) -> dict[str, Any]:
        """``{"count", "documents"}``: how many live documents no claim can take, and up to ``limit`` of them as
        ``{"id", "reason"}`` (``core.strays.reason``)."""
        count = await self._store.count_strays()
        docs = await self._store.strays(broken=False, limit=limit) if count and limit else []
        partitions = await self._store.partition_count()
        return {"count": count, "documents": [{"id": doc.get("_id"), "reason": strays.reason(doc, partitions)}
                                              for doc in docs]}

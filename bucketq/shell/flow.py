"""Messages into and out of a queue between two readings of its stats: ``bucketq stats --watch``'s in/s and out/s
and the dashboard's throughput chart."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from bucketq.store.aio.changes import watch_bucket_sizes


class Flow:
    """Messages into and out of one queue between refreshes.

    *In* is the number of messages in the buckets inserted meanwhile, as a change stream reports them (pushes,
    nacked messages written again for their retry, requeued entries). *Out* is *in* less the growth of the
    unfinished count (ready + scheduled + in flight): every message finished (acked, nacked, dead-lettered,
    quarantined, removed, purged). Successive stats alone cannot split the two: a count that did not change
    may be a thousand in and a thousand out. Without change streams (a server that is no replica set) the
    rates are None. ``warn`` receives a one-line reason when the change stream cannot be opened or fails."""

    DRAIN_S = 0.5  # the most one refresh spends reading events; what is left is counted at the next one

    def __init__(self, stream: Any, warn: Callable[[str], None]) -> None:
        self._stream = stream
        self._warn = warn
        self._inserted = 0
        self._last: tuple[float, int] | None = None  # (monotonic time, unfinished count) at the last refresh

    @classmethod
    async def open(cls, db: Any, name: str, warn: Callable[[str], None]) -> Flow:
        try:
            server_now = (await db.client.admin.command("isMaster"))["localTime"]
            stream = await watch_bucket_sizes(db[name], Timestamp(int(server_now.timestamp()), 0))
        except (PyMongoError, KeyError, NotImplementedError) as exc:  # the in-memory database has no isMaster
            warn(f"no in/out rates for {name!r}: they need change streams ({exc})")
            stream = None
        return cls(stream, warn)

    @property
    def watching(self) -> bool:
        """Whether the rates are measured (a change stream is open)."""
        return self._stream is not None

    async def rates(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """In and out since the last call (None at the first, and without a change stream)."""
        await self._drain()
        now, unfinished = time.monotonic(), row["ready"] + row["scheduled"] + row["in_flight"]
        inserted, self._inserted = self._inserted, 0
        last, self._last = self._last, (now, unfinished)
        if last is None or self._stream is None:
            return None
        return flow_rates(inserted, unfinished - last[1], now - last[0])

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.DRAIN_S
        try:
            while self._stream is not None and time.monotonic() < deadline:
                event = await self._stream.try_next()
                if event is None:
                    return
                n = (event.get("fullDocument") or {}).get("n")
                self._inserted += n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
        except PyMongoError as exc:
            self._warn(f"in/out rates stopped: the change stream failed ({exc})")
            await self.close()

    async def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.close()


def flow_rates(inserted: int, growth: int, seconds: float) -> dict[str, Any]:
    """Messages in (``inserted``) and out (finished: in less the growth of the unfinished count), and their
    rates per second over ``seconds``."""
    finished = max(0, inserted - growth)
    per_s = 1 / seconds if seconds > 0 else 0.0
    return {"in": inserted, "out": finished, "seconds": round(seconds, 3), "in_per_s": round(inserted * per_s, 1),
            "out_per_s": round(finished * per_s, 1)}

"""The producer's accumulator: groups pushed messages into buckets by due window, count, bytes and age.

Pure state: the caller passes the clock readings in, attaches an opaque ``waiter`` to each message (a future,
in the async shell), and writes the ``SealedBucket``s this returns. Modelled on aiokafka's record accumulator.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId

from bucketq.core.format import BUCKET_OVERHEAD, Slot, bucket_document

# Key of the bucket for messages due at once; delayed messages are keyed by their due window's index.
NOW = -1


@dataclass
class SealedBucket:
    """A bucket ready to be written: its document and the waiters of the pushes it holds."""

    document: dict[str, Any]
    waiters: list[Any]
    size_bytes: int
    immediate: bool  # due at once: the writer stamps ``due`` when it writes the bucket

    @property
    def id(self) -> ObjectId:
        return self.document["_id"]


@dataclass
class _OpenBucket:
    id: ObjectId
    opened_at: float  # monotonic seconds
    created: dt.datetime
    slots: list[Slot] = field(default_factory=list)
    waiters: list[Any] = field(default_factory=list)
    size_bytes: int = BUCKET_OVERHEAD
    latest_due: dt.datetime | None = None


class Accumulator:
    """Open buckets keyed by due window. ``add`` returns the buckets that the message made full."""

    def __init__(self, *, max_size: int, max_bytes: int, max_wait: float, granularity: float, codec: str) -> None:
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.max_wait = max_wait
        self.granularity = granularity
        self.codec = codec
        self._open: dict[int, _OpenBucket] = {}
        self.buffered_bytes = 0

    def fits(self, slot_size: int) -> bool:
        """Whether a message of ``slot_size`` bytes fits in an empty bucket."""
        return BUCKET_OVERHEAD + slot_size <= self.max_bytes

    def add(
        self,
        slot: Slot,
        slot_size: int,
        waiter: Any,
        *,
        due: dt.datetime | None,
        now_wall: dt.datetime,
        now_mono: float,
    ) -> list[SealedBucket]:
        """Buffer one message; return the buckets sealed by this add (at most two)."""
        key = NOW if due is None or due <= now_wall else math.floor(due.timestamp() / self.granularity)
        sealed: list[SealedBucket] = []
        bucket = self._open.get(key)
        if bucket is not None and bucket.size_bytes + slot_size > self.max_bytes:
            sealed.append(self._seal(key, now_wall))
            bucket = None
        if bucket is None:
            bucket = self._open[key] = _OpenBucket(ObjectId(), now_mono, now_wall)
        bucket.slots.append(slot)
        bucket.waiters.append(waiter)
        bucket.size_bytes += slot_size
        self.buffered_bytes += slot_size
        if key != NOW and (bucket.latest_due is None or due > bucket.latest_due):  # type: ignore[operator]
            bucket.latest_due = due
        if len(bucket.slots) >= self.max_size or bucket.size_bytes >= self.max_bytes:
            sealed.append(self._seal(key, now_wall))
        return sealed

    def expired(self, now_wall: dt.datetime, now_mono: float) -> list[SealedBucket]:
        """Seal every bucket open for ``max_wait`` or longer."""
        keys = [k for k, b in self._open.items() if now_mono - b.opened_at >= self.max_wait]
        return [self._seal(k, now_wall) for k in keys]

    def seal_all(self, now_wall: dt.datetime) -> list[SealedBucket]:
        return [self._seal(k, now_wall) for k in list(self._open)]

    def next_deadline(self) -> float | None:
        """Monotonic time at which the oldest open bucket must be sealed, or None when none is open."""
        if not self._open:
            return None
        return min(b.opened_at for b in self._open.values()) + self.max_wait

    def written(self, sealed: SealedBucket) -> None:
        """Release the buffer space of a bucket whose write finished (stored or failed for good)."""
        self.buffered_bytes -= sealed.size_bytes - BUCKET_OVERHEAD

    def _seal(self, key: int, now_wall: dt.datetime) -> SealedBucket:
        bucket = self._open.pop(key)
        # Due at once: visible from the moment it is written. Delayed: the latest due time of its messages,
        # which is at most one window (granularity) after any member's own due time.
        due = now_wall if key == NOW else bucket.latest_due
        document = bucket_document(bucket.id, bucket.slots, codec=self.codec, created=bucket.created, due=due)
        return SealedBucket(document, bucket.waiters, bucket.size_bytes, immediate=key == NOW)

"""The producer's accumulator: groups pushed messages into buckets by due window, count, bytes and age,
and decides when an open bucket is written (group commit).

A bucket holds messages of one priority level: the key of a level above 0 is the pair (key, level), so that the
default level's keys, and the cheap path of the common push (``append``), are those of a queue without priorities.

Group buckets (``push(group=...)``) are keyed by their group: a bucket holds one group only, and at most one
bucket of a group is written at a time, so that they take their places in the group (``s``, from the group's
counter, taken when written) in the order they were sealed: a later one waits, sealed, until the earlier write
ends, stored or failed.

Pure state: the caller passes the clock readings in, attaches a future-like ``waiter`` to each message, writes
the ``SealedBucket``s this returns and reports each write's end with ``written``. Modelled on aiokafka's record
accumulator and message batch.
"""

from __future__ import annotations

import datetime as dt
import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, islice
from typing import Any, Protocol

from bson import ObjectId

from bucketq.core.format import BUCKET_OVERHEAD, MAX_GROUP_BYTES, AnySlot, bucket_document
from bucketq.errors import WriteFailed

# What a group bucket stores besides its payloads, counted against ``max_bytes`` (the headroom below 16 MiB is
# for what consumers add later): ``g`` and ``s`` once, and a ``t`` entry (type, key of up to 5 digits, int32)
# per slot.
GROUP_OVERHEAD = MAX_GROUP_BYTES + 32
GROUP_SLOT_BYTES = 11

# Key of the bucket for messages due at once; delayed messages are keyed by their due window's index, grouped
# ones by their group (a str); either with its priority level when above 0.
NOW = -1
Key = int | str | tuple[int, int]


class Waiter(Protocol):
    """What waits for one pushed message: an ``asyncio.Future`` or anything with the same three methods."""

    def done(self) -> bool: ...

    def set_result(self, message_id: str) -> None: ...

    def set_exception(self, failure: BaseException) -> None: ...


class RunWaiter(Waiter, Protocol):
    """What waits for a run of messages added together (``extend``): settled once, with the ids of its slots."""

    def set_results(self, message_ids: list[str]) -> None: ...


@dataclass
class SealedBucket:
    """A bucket ready to be written: its document and the waiters of the pushes it holds, which it resolves."""

    document: dict[str, Any]
    waiters: list[Waiter]
    size_bytes: int
    immediate: bool  # due at once: the writer stamps ``due`` when it writes the bucket
    group: str | None = None
    merged: dict[int, str] = field(default_factory=dict)  # unique jobs: slot -> the id of the job it merged into
    # waiter index -> how many consecutive slots that waiter stands for, when more than one (``extend``'s runs)
    runs: dict[int, int] = field(default_factory=dict)

    @property
    def id(self) -> ObjectId:
        return self.document["_id"]

    def resolve(self, error: BaseException | None = None) -> None:
        """Settle each waiter still waiting, once: with its message id when the bucket is stored, else with a
        ``WriteFailed`` of its own caused by ``error`` (an exception object shared by several awaiting callers
        would gather all their tracebacks and chained contexts)."""
        waiters, self.waiters = self.waiters, []
        prefix = str(self.id)  # message ids are "<bucket id>:<slot>" (format.message_id), built in one pass
        if error is None:
            merged, runs = self.merged, self.runs
            if not merged and not runs:  # most buckets: a future a slot, in order
                for slot, waiter in enumerate(waiters):
                    if not waiter.done():
                        waiter.set_result(f"{prefix}:{slot}")
                return
            slot = 0
            for index, waiter in enumerate(waiters):
                count = runs.get(index, 1) if runs else 1
                if count == 1:
                    if not waiter.done():
                        waiter.set_result(merged[slot] if merged and slot in merged else f"{prefix}:{slot}")
                elif not waiter.done():
                    ids = [f"{prefix}:{s}" for s in range(slot, slot + count)]
                    if merged:
                        ids = [merged.get(s, i) for s, i in enumerate(ids, slot)]
                    waiter.set_results(ids)  # type: ignore[attr-defined]  # a run: RunWaiter
                slot += count
            return
        for waiter in waiters:
            if not waiter.done():
                failure = WriteFailed(f"bucket {prefix} was not stored: {error}")
                failure.__cause__ = error
                waiter.set_exception(failure)


@dataclass
class _OpenBucket:
    id: ObjectId
    opened_at: float  # monotonic seconds
    created: dt.datetime
    slots: list[AnySlot] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    runs: dict[int, int] = field(default_factory=dict)  # SealedBucket.runs
    size_bytes: int = BUCKET_OVERHEAD
    latest_due: dt.datetime | None = None
    group: str | None = None
    priority: int = 0


class Accumulator:
    """Open buckets keyed by due window. ``add`` returns the buckets that the message made full; ``ready``
    the ones to write now.

    Group commit: an open bucket is written as soon as no write is in flight, so a lone push costs one round
    trip; while writes are in flight it fills up, and goes when they end (``written``), when it is full, or
    after ``max_wait``, whichever comes first. Busy, buckets fill while earlier ones are stored; idle, nothing
    waits.
    """

    def __init__(self, *, max_size: int, max_bytes: int, max_wait: float, granularity: float, codec: str,
                 min_wait: float = 0.0, checked: bool = False) -> None:
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.max_slot_bytes = max_bytes - BUCKET_OVERHEAD  # the largest message an empty bucket takes
        self.max_wait = max_wait
        self.min_wait = min_wait
        self.granularity = granularity
        self.codec = codec
        self.checked = checked  # every payload added decodes with the codec: its buckets say so (format.CHECKED)
        self._open: dict[Key, _OpenBucket] = {}
        self.buffered_bytes = 0
        self.in_flight = 0  # buckets handed out to write and not yet reported ``written``
        # Groups with a bucket being written, each with its later sealed buckets waiting for that write to end.
        self._writing: dict[str, deque[SealedBucket]] = {}

    def add(
        self,
        slot: AnySlot,
        slot_size: int,
        waiter: Waiter,
        *,
        due: dt.datetime | None,
        now_wall: dt.datetime,
        now_mono: float,
        group: str | None = None,
        priority: int = 0,
    ) -> list[SealedBucket]:
        """Buffer one message; return the buckets to write now that this add sealed (at most two). A grouped
        message is due at once and of level 0 (the caller refuses a delay or a priority with a group)."""
        key: Key
        if group is not None:
            key = group
            slot_size += GROUP_SLOT_BYTES
        else:
            key = NOW if due is None or due <= now_wall else math.floor(due.timestamp() / self.granularity)
            if priority:
                key = (key, priority)
        sealed: list[SealedBucket] = []
        bucket = self._open.get(key)
        if bucket is not None and bucket.size_bytes + slot_size > self.max_bytes:
            sealed += self._seal(key, now_wall)
            bucket = None
        if bucket is None:
            bucket = self._open[key] = _OpenBucket(ObjectId(), now_mono, now_wall, group=group, priority=priority)
            if group is not None:
                bucket.size_bytes += GROUP_OVERHEAD
                self.buffered_bytes += GROUP_OVERHEAD  # given back with the rest by ``written``
        bucket.slots.append(slot)
        bucket.waiters.append(waiter)
        bucket.size_bytes += slot_size
        self.buffered_bytes += slot_size
        if _window(key) != NOW and due is not None and (bucket.latest_due is None or due > bucket.latest_due):
            bucket.latest_due = due
        if len(bucket.slots) >= self.max_size or bucket.size_bytes >= self.max_bytes:
            sealed += self._seal(key, now_wall)
        return sealed

    def append(self, slot: AnySlot, slot_size: int, waiter: Waiter) -> bool:
        """The common push, kept cheap (no clock read, nothing to seal): add a message due at once and ungrouped to
        the open bucket of such messages if there is one that it leaves short of full. False when it did nothing:
        the caller then goes through ``add``, which opens and seals buckets (once a bucket, not once a message)."""
        bucket = self._open.get(NOW)
        if bucket is None:
            return False
        slots, size = bucket.slots, bucket.size_bytes + slot_size
        if len(slots) + 1 >= self.max_size or size >= self.max_bytes:
            return False
        slots.append(slot)
        bucket.waiters.append(waiter)
        bucket.size_bytes = size
        self.buffered_bytes += slot_size
        return True

    def extend(self, slots: list[AnySlot], sizes: list[int], start: int, end: int, waiter: RunWaiter, room: int) -> int:
        """``append`` for many messages at once (``push_many``): add ``slots[start:end]`` (their sizes in ``sizes``),
        as many as the open bucket of messages due now takes without being made full and as fit in ``room``
        bytes, under one waiter settled once (``RunWaiter.set_results``). Returns how many it took: 0 when there
        is no such open bucket or the first does not fit; the caller then ``add``s that one."""
        bucket = self._open.get(NOW)
        if bucket is None:
            return 0
        taken = min(self.max_size - 1 - len(bucket.slots), end - start)
        if taken <= 0:
            return 0
        # append's byte rule for each message in turn: the bucket stays below max_bytes
        ends = list(accumulate(islice(sizes, start, start + taken), initial=bucket.size_bytes))
        fits = bisect_left(ends, min(self.max_bytes, bucket.size_bytes + room + 1), lo=1) - 1
        if fits <= 0:
            return 0
        bucket.slots += slots[start:start + fits]
        if fits > 1:
            bucket.runs[len(bucket.waiters)] = fits
        bucket.waiters.append(waiter)
        added = ends[fits] - bucket.size_bytes
        bucket.size_bytes = ends[fits]
        self.buffered_bytes += added
        return fits

    def ready(self, now_wall: dt.datetime, now_mono: float) -> list[SealedBucket]:
        """Seal the open buckets to write now: when no write is in flight, those open for ``min_wait`` or
        longer (all of them with the default 0), else those open for ``max_wait`` or longer. The caller asks
        once its current burst of ``add``s is done (so that a burst shares buckets), whenever a write ends,
        and at ``next_deadline``."""
        wait = self._wait()
        # The same sum as next_deadline's, so that a timer set for a deadline finds it due when it fires.
        keys = [k for k, b in self._open.items() if b.opened_at + wait <= now_mono]
        return [sealed for k in keys for sealed in self._seal(k, now_wall)]

    def _wait(self) -> float:
        return self.max_wait if self.in_flight else self.min_wait

    def seal_all(self, now_wall: dt.datetime) -> list[SealedBucket]:
        """Seal every open bucket; return those to write now (the others wait for their group's write)."""
        return [sealed for k in list(self._open) for sealed in self._seal(k, now_wall)]

    def next_deadline(self) -> float | None:
        """Monotonic time at which the oldest open bucket is due to be sealed (``ready``), or None when none
        is open."""
        if not self._open:
            return None
        return min(b.opened_at for b in self._open.values()) + self._wait()

    def written(self, sealed: SealedBucket) -> list[SealedBucket]:
        """A bucket's write finished (stored or failed for good): one write fewer in flight, and its buffer
        space released. Returns the bucket of the same group that waited for this write, to write now."""
        self.in_flight -= 1
        self.buffered_bytes -= sealed.size_bytes - BUCKET_OVERHEAD
        if sealed.group is None:
            return []
        waiting = self._writing[sealed.group]
        if not waiting:
            del self._writing[sealed.group]
            return []
        self.in_flight += 1
        return [waiting.popleft()]

    def _seal(self, key: Key, now_wall: dt.datetime) -> list[SealedBucket]:
        """Close the open bucket of ``key``; return it to write now, or nothing while its group has a write in
        flight (``written`` hands it out when that write ends)."""
        bucket = self._open.pop(key)
        # Due at once: visible from the moment it is written. Delayed: the latest due time of its messages,
        # which is at most one window (granularity) after any member's own due time.
        group = bucket.group
        immediate = _window(key) == NOW or group is not None
        due = now_wall if immediate else bucket.latest_due
        assert due is not None  # every add to a delayed bucket sets latest_due
        document = bucket_document(bucket.id, bucket.slots, codec=self.codec, created=bucket.created, due=due,
                                   group=group, priority=bucket.priority, checked=self.checked)
        sealed = SealedBucket(document, bucket.waiters, bucket.size_bytes, immediate=immediate, group=group,
                              runs=bucket.runs)
        if group is not None:
            waiting = self._writing.get(group)
            if waiting is not None:
                waiting.append(sealed)
                return []
            self._writing[group] = deque()
        self.in_flight += 1
        return [sealed]


def _window(key: Key) -> int | str:
    """The key without its priority level."""
    return key[0] if isinstance(key, tuple) else key

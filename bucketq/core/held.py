"""Per-message state of one claimed bucket, and the flush plans that make it durable.

Slots move PENDING -> SERVED -> ACKED | RETRY | DEAD; a slot can also go straight from PENDING to DEAD (tries
used up by lease expiries), ACKED (dedupe: key already processed) or QUARANTINED (undecodable). Resolutions
are kept in memory until a ``FlushPlan`` carries them to the server; the plan is built once and retried as
is, so the ids of the documents it writes are stable and a retry stores nothing twice.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections import deque
from dataclasses import dataclass, field
from bson import ObjectId

from bucketq.core import claims
from bucketq.core.format import StoredBucket, bucket_document, dead_letter, quarantined_message
from bucketq.errors import AlreadyResolved


class SlotState(enum.Enum):
    PENDING = "pending"
    SERVED = "served"
    ACKED = "acked"
    RETRY = "retry"
    DEAD = "dead"
    QUARANTINED = "quarantined"
    DONE = "done"  # finished before this claim




@dataclass
class _Resolution:
    state: SlotState
    retry_at: dt.datetime | None = None
    error: str = ""
    delivered: bool = True  # handed to a handler this claim, so it counts as a try


@dataclass
class FlushPlan:
    """The writes that make a set of resolutions durable, in order:

    1. ``guard``: when copies are written, a fenced lease extension first, so that a consumer which lost
       its lease does not copy messages someone else now holds;
    2. ``retry_docs``, ``dead_docs``, ``quarantine_docs``: copies, idempotent by ``_id``;
    3. ``final``: ``("delete", None)`` when every slot is finished, else ``("update", update)``, fenced.
    """

    bucket_id: ObjectId
    token: str
    slots: dict[int, SlotState]
    guard: dict | None = None
    retry_docs: list[dict] = field(default_factory=list)
    dead_docs: list[dict] = field(default_factory=list)
    quarantine_docs: list[dict] = field(default_factory=list)
    final: tuple[str, dict | None] = ("update", None)
    releases: bool = False
    lease_until: dt.datetime | None = None  # the expiry this plan's writes set, once the server applied them

    @property
    def filter(self) -> dict:
        return claims.fenced(self.bucket_id, self.token)


class HeldBucket:
    """A bucket this consumer holds under ``token`` until ``lease_until``."""

    def __init__(self, bucket: StoredBucket, token: str, lease_until: dt.datetime, *, max_attempts: int) -> None:
        self.bucket = bucket
        self.token = token
        self.lease_until = lease_until
        self.max_attempts = max_attempts
        self.lost = False
        self.state = [SlotState.DONE if i in bucket.done else SlotState.PENDING for i in range(bucket.size)]
        self._pending: deque[int] = deque(i for i in range(bucket.size) if i not in bucket.done)
        self._unresolved = len(self._pending)
        self._unflushed: dict[int, _Resolution] = {}

    # -- serving -------------------------------------------------------------------------------------------

    def tries(self, slot: int) -> int:
        """Deliveries of this message before the current one."""
        return self.bucket.base_tries[slot] + self.bucket.claims - 1

    def next_pending(self) -> int | None:
        """The next slot to hand out, marked SERVED; None when nothing is left to serve."""
        while self._pending:
            slot = self._pending.popleft()
            if self.state[slot] is SlotState.PENDING:
                self.state[slot] = SlotState.SERVED
                return slot
        return None

    @property
    def outstanding(self) -> list[int]:
        """Slots handed out and not yet resolved."""
        return [i for i, s in enumerate(self.state) if s is SlotState.SERVED]

    @property
    def finished(self) -> bool:
        return self._unresolved == 0

    @property
    def dirty(self) -> bool:
        return bool(self._unflushed)

    # -- resolving -----------------------------------------------------------------------------------------

    def ack(self, slot: int) -> None:
        self._resolve(slot, _Resolution(SlotState.ACKED), allowed=(SlotState.SERVED, SlotState.PENDING))

    def nack(self, slot: int, retry_at: dt.datetime, error: str = "") -> SlotState:
        """Retry the message at ``retry_at``, or dead-letter it when this was its last attempt."""
        if self.tries(slot) + 1 >= self.max_attempts:
            self._resolve(slot, _Resolution(SlotState.DEAD, error=error or "nacked"), allowed=(SlotState.SERVED,))
            return SlotState.DEAD
        self._resolve(slot, _Resolution(SlotState.RETRY, retry_at, error), allowed=(SlotState.SERVED,))
        return SlotState.RETRY

    def dead(self, slot: int, reason: str) -> None:
        self._resolve(slot, _Resolution(SlotState.DEAD, error=reason), allowed=(SlotState.SERVED, SlotState.PENDING))

    def quarantine(self, slot: int, reason: str) -> None:
        self._resolve(slot, _Resolution(SlotState.QUARANTINED, error=reason),
                      allowed=(SlotState.SERVED, SlotState.PENDING))

    def _resolve(self, slot: int, resolution: _Resolution, *, allowed: tuple[SlotState, ...]) -> None:
        if self.state[slot] not in allowed:
            raise AlreadyResolved(f"message {self.bucket.message_id(slot)} is already {self.state[slot].value}")
        resolution.delivered = self.state[slot] is SlotState.SERVED
        self._unresolved -= 1
        self.state[slot] = resolution.state
        self._unflushed[slot] = resolution

    # -- flushing ------------------------------------------------------------------------------------------

    def plan(self, now: dt.datetime, lease_s: float, *, granularity: float, release: bool = False,
             release_due: dt.datetime | None = None, host: str = "", pid: int = 0) -> FlushPlan:
        """The writes for every resolution made since the last plan (and, if asked, the release)."""
        taken, self._unflushed = self._unflushed, {}
        plan = FlushPlan(self.bucket.id, self.token, {s: r.state for s, r in taken.items()})
        retries = {s: r for s, r in taken.items() if r.state is SlotState.RETRY}
        plan.retry_docs = self._retry_documents(retries, now, granularity)
        plan.dead_docs = [dead_letter(self.bucket, s, tries=self.tries(s) + r.delivered,
                                      error=r.error, at=now)
                          for s, r in taken.items() if r.state is SlotState.DEAD]
        plan.quarantine_docs = [quarantined_message(self.bucket, s, reason=r.error, at=now, host=host, pid=pid)
                                for s, r in taken.items() if r.state is SlotState.QUARANTINED]
        done = sorted(taken)
        copies = plan.retry_docs or plan.dead_docs or plan.quarantine_docs
        if copies:
            acked = [s for s in done if taken[s].state is SlotState.ACKED]
            plan.guard = claims.extend(now, lease_s, acked)
        if release:
            plan.final = ("update", claims.release(now, done, due=release_due))
            plan.releases = True
        elif self.finished:
            plan.final = ("delete", None)
        else:
            plan.final = ("update", claims.extend(now, lease_s, done))
        if not release:
            plan.lease_until = now + dt.timedelta(seconds=lease_s)
        return plan

    def _retry_documents(self, retries: dict[int, _Resolution], now: dt.datetime, granularity: float) -> list[dict]:
        """Nacked messages, grouped by due window into new buckets due at their own retry times."""
        windows: dict[int, list[int]] = {}
        for slot, r in retries.items():
            windows.setdefault(math.floor(r.retry_at.timestamp() / granularity), []).append(slot)  # type: ignore[union-attr]
        docs = []
        for slots in windows.values():
            due = max(retries[s].retry_at for s in slots)  # type: ignore[type-var]
            copies = [self.bucket.slot(s, tries=self.tries(s) + 1) for s in sorted(slots)]
            docs.append(bucket_document(ObjectId(), copies, codec=self.bucket.codec, created=now, due=due))
        return docs


def dead_letter_reason_for_expired(tries: int) -> str:
    return f"delivered {tries} times without an ack (leases expired: the consumer died or hung)"


"""The consume state machine of one claimed bucket: everything that changes its state lives here.

Slots move PENDING -> SERVED -> ACKED | RETRY | DEAD; a slot can also go straight from PENDING to DEAD (tries
used up by lease expiries), ACKED (dedupe: key already processed) or QUARANTINED (undecodable). Resolutions
are kept in memory until a ``FlushPlan`` carries them to the server. The shell runs the plan's writes and
reports back with ``outcome(plan, applied)``: applied (the server took it under this claim's token) or
refused (the lease was lost). A plan whose writes raised stays pending and is handed out again as it was, so
the ids of the documents it writes are stable and a retry stores nothing twice.

A group bucket (``bucket.group``) is served serially: the next slot only once the one served is resolved. A nack
there does not copy the message to a retry bucket (that would let the group's later messages overtake it): the
bucket is released, due at the retry time, with that slot's try added, and nothing more is served from it.

The bucket as a whole: HELD (serving) until it is *ended*, by a finish or release the server applied, or by
a refused write (lost). Once ended, every resolution raises ``LeaseLost``.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from bucketq.core import cancel, claims, groups
from bucketq.core.format import StoredBucket, bucket_documents, dead_letter, quarantined_message
from bucketq.errors import AlreadyResolved, LeaseLost


class SlotState(enum.Enum):
    PENDING = "pending"
    SERVED = "served"
    ACKED = "acked"
    RETRY = "retry"
    DEAD = "dead"
    QUARANTINED = "quarantined"
    DONE = "done"  # finished before this claim


# The states that serving and acking each message compare with, as module names: on Python 3.11, reading an enum
# member off its class costs about 200 ns, ten times a global, and every message of a bucket reads them.
_PENDING, _SERVED, _ACKED = SlotState.PENDING, SlotState.SERVED, SlotState.ACKED
_RESOLVABLE = (_SERVED, _PENDING)  # what an ack or a dead letter may resolve


@dataclass(frozen=True)
class Policy:
    """The consume settings the state machine needs (from ``QueueOptions``)."""

    lease: float
    max_attempts: int
    granularity: float
    # Stop serving this share of the lease before it runs out, in case no extension got through.
    safety: float = 0.1

    def lease_from(self, now: dt.datetime) -> dt.datetime:
        return now + dt.timedelta(seconds=self.lease)


@dataclass
class _Resolution:
    state: SlotState
    retry_at: dt.datetime | None = None
    error: str = ""
    delivered: bool = True  # handed to a handler this claim, so it counts as a try (read for dead letters only)
    cancelled: bool = False  # a DEAD slot ended by a cancel request: its dead letter is the cancellation's record


# Every ack is alike: one shared record, not one made per message.
_ACK = _Resolution(SlotState.ACKED)


@dataclass
class FlushPlan:
    """The writes that make a set of resolutions durable, in order:

    1. ``guard``: when copies are written, a fenced lease extension first, so that a consumer which lost
       its lease does not copy messages someone else now holds; it records the retry copies' ids in ``r``
       (``claims.guard``), which ``final`` takes out again;
    2. ``retry_docs``, ``dead_docs``, ``quarantine_docs``: copies, idempotent by ``_id``;
    3. ``final``, fenced: an extension (``kind == "extend"``), a release, or the tombstone that finishes
       the bucket (``kind == "finish"``, a replacement). ``mine`` is the filter that only this token's own
       earlier attempt of ``final`` can satisfy, for a retry that matches nothing (None: such a retry means
       the lease was lost).
    """

    ref: dict  # the bucket's shard key (``StoredBucket.ref``)
    token: str
    slots: dict[int, SlotState]
    kind: str = "extend"  # extend | release | finish
    final: dict = field(default_factory=dict)
    mine: dict | None = None
    guard: dict | None = None
    retry_docs: list[dict] = field(default_factory=list)
    dead_docs: list[dict] = field(default_factory=list)
    quarantine_docs: list[dict] = field(default_factory=list)
    lease_until: dt.datetime | None = None  # the expiry this plan's writes set, once the server applied them
    # Group buckets: the group's lock is extended to this expiry (when it would otherwise expire before the new
    # lease), fenced by the token, before the bucket's lease (by ``guard`` or ``final``), so that the lock never
    # expires before the lease.
    group: str | None = None
    lock_until: dt.datetime | None = None

    @property
    def filter(self) -> dict:
        return claims.fenced(self.ref, self.token)

    @property
    def ends(self) -> bool:
        return self.kind != "extend"

    @property
    def lone_finish(self) -> bool:
        """A finish that is its fenced replacement alone (no copies, no guard, no ordered group's lock or turn to
        end): the finishes of several buckets can go in one bulk write."""
        return (self.kind == "finish" and self.guard is None and self.group is None
                and not (self.retry_docs or self.dead_docs or self.quarantine_docs))


class ClaimedBucket:
    """A bucket this consumer holds under ``token`` until ``lease_until``."""

    def __init__(self, bucket: StoredBucket, token: str, lease_until: dt.datetime, policy: Policy) -> None:
        self.bucket = bucket
        self.token = token
        self.policy = policy
        self._margin = dt.timedelta(seconds=policy.lease * policy.safety)  # see lease_ending
        self.lease_until = lease_until
        self.lost = False
        self.ended = False
        self.giving_back = False  # a drain is releasing the bucket: no more resolutions
        self.state = [_PENDING] * bucket.size
        for i in bucket.done:
            self.state[i] = SlotState.DONE
        # Slots not yet handed out, in serve order (a superset: some may have been resolved unserved). An attribute,
        # not a property: a consumer asks each bucket it holds before each message it serves.
        self.unserved: deque[int] = deque(i for i in range(bucket.size) if i not in bucket.done) if bucket.done \
            else deque(range(bucket.size))
        self._unresolved = len(self.unserved)
        self.cancels = set(bucket.cancels)  # slots whose cancellation was requested, as known to this claim
        self._cancels_read_at = lease_until - dt.timedelta(seconds=policy.lease)  # the claim's reply had them
        # Whether a slot may have used up its tries (leases that kept expiring): only then does serve check each.
        self._may_expire = max(bucket.base_tries, default=0) + bucket.claims - 1 >= policy.max_attempts
        self._unflushed: dict[int, _Resolution] = {}
        self._plan: FlushPlan | None = None  # handed out, outcome not yet known
        # Group buckets: the slot being served (one at a time), and the nacked slot that holds the bucket back.
        self._serving: int | None = None
        self.held_back: int | None = None
        self.lock_until = lease_until  # the group's lock: taken with the lease's expiry, then as applied

    @property
    def lease_until(self) -> dt.datetime:
        """The lease's expiry as the server last applied it."""
        return self._lease_until

    @lease_until.setter
    def lease_until(self, value: dt.datetime) -> None:
        self._lease_until = value
        self._serve_until = value - self._margin  # lease_ending's bound: not worked out again a message

    # -- serving -------------------------------------------------------------------------------------------

    def tries(self, slot: int) -> int:
        """Deliveries of this message before the current one."""
        return self.bucket.base_tries[slot] + self.bucket.claims - 1

    def lease_ending(self, now: dt.datetime) -> bool:
        """Lost, ended, or within the safety margin of the lease expiry the server last applied."""
        return self.lost or self.ended or now >= self._serve_until

    def serve(self, now: dt.datetime) -> int | None:
        """The next slot to hand out, marked SERVED; None when nothing is left or the lease is ending.
        Slots whose tries are used up (leases that kept expiring) are dead-lettered on the way, unserved."""
        unserved, state, group = self.unserved, self.state, self.bucket.group
        if not unserved or self.lost or self.ended or now >= self._serve_until:  # lease_ending, written out
            return None
        if group is not None and (self._serving is not None or self.held_back is not None):
            return None
        while unserved:
            slot = unserved.popleft()
            if state[slot] is not _PENDING:
                continue
            if slot in self.cancels:  # cancelled before it was served: recorded, never delivered
                self._resolve(slot, _cancellation(), allowed=(SlotState.PENDING,))
                continue
            if self._may_expire and (tries := self.tries(slot)) >= self.policy.max_attempts:
                self._resolve(slot, _Resolution(SlotState.DEAD, error=dead_letter_reason_for_expired(tries)),
                              allowed=(SlotState.PENDING,))
                continue
            state[slot] = _SERVED
            if group is not None:
                self._serving = slot
            return slot
        return None

    def serve_many(self, now: dt.datetime, n: int) -> list[int]:
        """Up to ``n`` slots to hand out, as that many ``serve`` calls would give them, in one pass when every slot
        is served alike (no group, no tries that may be used up, no cancellation requested)."""
        slots: list[int] = []
        if self.bucket.group is not None or self._may_expire or self.cancels:
            while len(slots) < n and (slot := self.serve(now)) is not None:
                slots.append(slot)
            return slots
        if not self.unserved or self.lease_ending(now):
            return []
        pending, state = self.unserved, self.state
        while pending and len(slots) < n:
            slot = pending.popleft()
            if state[slot] is _PENDING:
                state[slot] = _SERVED
                slots.append(slot)
        return slots

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

    def needs_flush(self, now: dt.datetime) -> bool:
        """Resolutions to write, a failed plan to retry, or a lease past half its time."""
        if self.ended:
            return False
        half = dt.timedelta(seconds=self.policy.lease / 2)
        return self.dirty or self.finished or self._plan is not None or self.lease_until - now < half

    # -- resolving -----------------------------------------------------------------------------------------

    def resolved(self, slot: int) -> bool:
        """Whether ``slot`` was resolved (acked, nacked, ...) or given back by this claim."""
        return self.state[slot] not in _RESOLVABLE or self.giving_back

    def check_held(self, slot: int) -> None:
        """Raise ``LeaseLost`` when this claim can no longer resolve ``slot``."""
        if self.lost or self.ended or self.giving_back:
            raise LeaseLost(f"bucket {self.bucket.id} is no longer held by this consumer; message "
                            f"{self.bucket.message_id(slot)} will be delivered again")

    def ack(self, slot: int) -> bool:
        """Returns whether the bucket is due a flush now: finished, or held back by a group's nack."""
        if (self.state[slot] is not _SERVED or self.bucket.group is not None or self.lost or self.ended
                or self.giving_back or self.cancels):
            # a group's serving slot, LeaseLost, a cancelled message's end, acked unserved (dedupe), AlreadyResolved
            self._resolve(slot, _ACK, allowed=_RESOLVABLE)
        else:  # what _resolve does for a served slot of a bucket served alike, written out (an ack a message)
            self.state[slot] = _ACKED
            self._unflushed[slot] = _ACK
            self._unresolved -= 1
        return self._unresolved == 0 or self.held_back is not None  # finished, written out: no property call

    def ack_each(self, slots: Iterable[int]) -> bool:
        """``ack`` of each slot in turn (the first that raises stops it), in one pass over slots served alike.
        Returns what ``ack`` returns."""
        if self.bucket.group is not None or self.lost or self.ended or self.giving_back or self.cancels:
            for slot in slots:
                self._resolve(slot, _ACK, allowed=_RESOLVABLE)  # see ack
        else:
            state, unflushed = self.state, self._unflushed
            for slot in slots:
                if state[slot] is not _SERVED:
                    self._resolve(slot, _ACK, allowed=_RESOLVABLE)  # acked unserved (dedupe), or AlreadyResolved
                    continue
                state[slot] = _ACKED
                unflushed[slot] = _ACK
                self._unresolved -= 1
        return self._unresolved == 0 or self.held_back is not None

    def nack(self, slot: int, retry_at: dt.datetime, error: str = "") -> SlotState:
        """Retry the message at ``retry_at``, or dead-letter it when this was its last attempt (or its
        cancellation was requested: then it ends as cancelled, see ``_resolve``)."""
        if self.tries(slot) + 1 >= self.policy.max_attempts or slot in self.cancels:
            self._resolve(slot, _Resolution(SlotState.DEAD, error=error or "nacked"), allowed=(SlotState.SERVED,))
            return SlotState.DEAD
        self._resolve(slot, _Resolution(SlotState.RETRY, retry_at, error), allowed=(SlotState.SERVED,))
        if self.bucket.group is not None:
            self.held_back = slot
        return SlotState.RETRY

    def dead(self, slot: int, reason: str) -> None:
        """Dead-letter the message at once, without further tries."""
        self._resolve(slot, _Resolution(SlotState.DEAD, error=reason), allowed=_RESOLVABLE)

    def quarantine(self, slot: int, reason: str) -> None:
        self._resolve(slot, _Resolution(SlotState.QUARANTINED, error=reason),
                      allowed=_RESOLVABLE)

    def cancel_requested(self, slot: int) -> bool:
        """Whether this claim knows of a request to cancel ``slot`` (``core.cancel``)."""
        return slot in self.cancels

    def end_cancelled(self) -> None:
        """End as cancelled, unserved, every pending message whose cancellation was requested before the claim (the
        claim's reply had the requests): the claim step's rule, so that no claimant, consumer or batch, hands one
        out. Their records go with the bucket's next write (a flush)."""
        for slot in sorted(self.cancels):
            if self.state[slot] is _PENDING:
                self._resolve(slot, _cancellation(), allowed=(SlotState.PENDING,))

    def cancels_due(self, now: dt.datetime) -> bool:
        """Whether to read the bucket's cancel requests again (half a lease since the last read); if so, the read
        is counted as made."""
        if now - self._cancels_read_at < dt.timedelta(seconds=self.policy.lease / 2):
            return False
        self._cancels_read_at = now
        return True

    def learn_cancels(self, slots: list[int]) -> list[int]:
        """Take in the cancel requests read from the server (``x``); return the slots newly
        requested that are being handled now, whose handlers should hear of it. A slot not yet served is cancelled
        when its turn comes (``serve``); one already resolved keeps its resolution."""
        new = [s for s in slots if s not in self.cancels and 0 <= s < self.bucket.size]
        self.cancels.update(new)
        return [s for s in new if self.state[s] is SlotState.SERVED]

    def _resolve(self, slot: int, resolution: _Resolution, *, allowed: tuple[SlotState, ...]) -> None:
        self.check_held(slot)
        if self.state[slot] not in allowed:
            raise AlreadyResolved(f"message {self.bucket.message_id(slot)} is already {self.state[slot].value}")
        if slot in self.cancels and resolution.state is not SlotState.QUARANTINED:
            # Whatever the handler made of a message whose cancellation it was told of, it ends as cancelled:
            # not acked as a success, not retried.
            resolution = _cancellation()
        if resolution is not _ACK:
            resolution.delivered = self.state[slot] is _SERVED
        if slot == self._serving:
            self._serving = None
        self._unresolved -= 1
        self.state[slot] = resolution.state
        self._unflushed[slot] = resolution

    def give_back(self, now: dt.datetime, reason: str) -> None:
        """Before a release: messages still being handled are retried at once (their try counts, as the
        handler ran), and later acks or nacks of them raise ``LeaseLost``."""
        for slot in self.outstanding:
            self.nack(slot, now, reason)
        self.giving_back = True

    # -- flushing ------------------------------------------------------------------------------------------

    def take_plan(self, now: dt.datetime, *, release: bool = False, release_due: dt.datetime | None = None,
                  host: str = "", pid: int = 0) -> FlushPlan:
        """The writes to run next: a plan handed out earlier whose outcome is unknown (its writes raised) is
        handed out again as it was; else a new plan of every resolution since the last one, ending with a
        release if asked, a finish when every slot is resolved, else a lease extension."""
        if self._plan is None:
            self._plan = self._new_plan(now, release, release_due, host, pid)
        return self._plan

    def outcome(self, plan: FlushPlan, applied: bool) -> None:
        """Take back the result of ``plan``'s writes: applied under this token, or refused (lease lost)."""
        if plan is self._plan:
            self._plan = None
        if not applied:
            self.lost = self.ended = True
            return
        # Only an extension the server applied counts: one still in flight (a server restarting) must not
        # let this consumer serve messages of a bucket someone else may already have claimed.
        if plan.lease_until is not None and plan.lease_until > self.lease_until:
            self.lease_until = plan.lease_until
        if plan.lock_until is not None and plan.lock_until > self.lock_until:
            self.lock_until = plan.lock_until
        if plan.ends:
            self.ended = True

    def _new_plan(self, now: dt.datetime, release: bool, release_due: dt.datetime | None, host: str,
                  pid: int) -> FlushPlan:
        taken, self._unflushed = self._unflushed, {}
        group = self.bucket.group
        if list(taken.values()).count(_ACK) == len(taken):  # acks alone, as most flushes hold (counted in C)
            states, copied = dict.fromkeys(taken, _ACKED), {}
        else:
            states = {s: r.state for s, r in taken.items()}
            copied = {s: r for s, r in taken.items() if r is not _ACK}  # the acks copy nothing
        plan = FlushPlan(self.bucket.ref, self.token, states, group=group)
        retries = {s: r for s, r in copied.items() if r.state is SlotState.RETRY}
        if group is None:
            plan.retry_docs = self._retry_documents(retries, now)
        plan.dead_docs = [dead_letter(self.bucket, s, tries=self.tries(s) + r.delivered, error=r.error, at=now,
                                      cancelled=r.cancelled) for s, r in copied.items() if r.state is SlotState.DEAD]
        plan.quarantine_docs = [quarantined_message(self.bucket, s, reason=r.error, at=now, host=host, pid=pid)
                                for s, r in copied.items() if r.state is SlotState.QUARANTINED]
        # A group's nacked slot stays in its bucket (released, due at the retry time): not done.
        done = sorted(taken) if group is None else sorted(s for s in taken if s not in retries)
        copies = [d["_id"] for d in plan.retry_docs]
        if plan.retry_docs or plan.dead_docs or plan.quarantine_docs:
            acked = [s for s in done if taken[s].state is SlotState.ACKED]
            plan.guard = claims.guard(now, self.policy.lease, acked, copies)
        if group is not None and (release or retries):
            # A nacked slot holds the bucket (and its group) until its retry time; a drain hands it back now.
            retry_slot = next(iter(retries), None)
            due = retries[retry_slot].retry_at if retry_slot is not None else release_due
            plan.kind, plan.final = "release", groups.release(now, self.token, done, due=due, retry_slot=retry_slot)
            plan.mine = claims.released_by(self.bucket.ref, self.token)
        elif release:
            plan.kind = "release"
            plan.final = claims.copies_landed(claims.release(now, self.token, done, due=release_due), copies)
            plan.mine = claims.released_by(self.bucket.ref, self.token)
        elif self.finished:
            plan.kind, plan.final = "finish", claims.finish(now, self.token, self.bucket.partition)
            plan.mine = claims.finished_by(self.bucket.ref, self.token)
        else:
            plan.final = claims.copies_landed(claims.extend(now, self.policy.lease, done), copies)
            plan.lease_until = self.policy.lease_from(now)
        if group is not None and (plan.guard is not None or plan.kind == "extend"):  # they set the lease to:
            plan.lock_until = groups.lock_extension(self.lock_until, self.policy.lease_from(now), self.policy.lease)
        return plan

    def _retry_documents(self, retries: dict[int, _Resolution], now: dt.datetime) -> list[dict]:
        """Nacked messages, grouped by due window into new buckets due at their own retry times, split
        so that no bucket exceeds the size limits."""
        windows: dict[int, list[int]] = {}
        retry_at: dict[int, dt.datetime] = {}
        for slot, r in retries.items():
            assert r.retry_at is not None
            retry_at[slot] = r.retry_at
            windows.setdefault(math.floor(r.retry_at.timestamp() / self.policy.granularity), []).append(slot)
        docs = []
        for slots in windows.values():
            due = max(retry_at[s] for s in slots)
            copies = [self.bucket.slot(s, tries=self.tries(s) + 1) for s in sorted(slots)]
            docs += bucket_documents(copies, codec=self.bucket.codec, created=now, due=due,
                                     partition=self.bucket.partition or 0,  # in its bucket's partition
                                     priority=self.bucket.priority,
                                     checked=self.bucket.checked)  # copies of payloads its writer checked
        return docs


def _cancellation() -> _Resolution:
    return _Resolution(SlotState.DEAD, error=cancel.REASON, cancelled=True)


def dead_letter_reason_for_expired(tries: int) -> str:
    return f"delivered {tries} times without an ack (leases expired: the consumer died or hung)"

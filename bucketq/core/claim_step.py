"""The claim step as a conversation with the store, sans-I/O: a generator that yields the next store call (a
``ClaimStep``) and takes its reply back, h11 style. The async consumer (``consumer.claiming.Claiming.claim``) and
the batch queue (``batch.BatchQueue._claim_step``) carry it (``core.conversation``); what a claim's reply decides
lives here, once:

- nothing is claimed while an operator paused the queue (``Queue.pause``);
- the partitions are tried in turn (``sharding.Rotation``), by priority or age (``priorities.Turns``);
- a bucket claimed without counting (``unclaimable``), one whose fields do not hold together, one the claimant
  cannot read (``Open``'s reply) or, under ``quarantine_malformed``, one with an undecodable message goes to
  quarantine whole;
- an ordered group's bucket is served only in the group's turn (``group_turn.take_turn``); when the group was
  free, its earliest live bucket is claimed instead;
- the messages whose cancellation was requested before the claim end as cancelled, unserved
  (``ClaimedBucket.end_cancelled``: the bucket's next write records them);
- under ``dedupe``, the messages whose key was processed already are acked unserved;
- the rest is held (``Hold``).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bucketq.core import claims, group_turn, groups
from bucketq.core.format import StoredBucket, parse_bucket
from bucketq.core.group_turn import GroupStep
from bucketq.core.held import ClaimedBucket, Policy, SlotState
from bucketq.core.priorities import Turns
from bucketq.core.sharding import Rotation
from bucketq.errors import MalformedBucket


@dataclass(frozen=True)
class ReadPause:
    """Whether an operator paused the queue; reply: a bool."""


@dataclass(frozen=True)
class ReadClock:
    """The server's time; reply: (now, the earliest reading the clock's error allows)."""


@dataclass(frozen=True)
class ReadPartitions:
    """The queue's partition count; reply: an int."""


@dataclass(frozen=True)
class Claim:
    """``store.claim(spec)``; reply: (the bucket, None), (None, None) when none is due, or (the bucket, why it
    must go to quarantine)."""

    spec: tuple[dict, dict, list]


@dataclass(frozen=True)
class Quarantine:
    """Copy ``doc`` (claimed under ``token``) to quarantine with ``reason`` and finish it, fenced; reply: whether
    it was (False: the lease was lost, nothing copied)."""

    doc: dict[str, Any]
    token: str
    reason: str


@dataclass(frozen=True)
class Opened:
    """A bucket its claimant can read: its ``payloads`` (decoded, or with ``load`` as stored, decoded one at a
    time as each is served), and why each undecodable one failed (``bad``, by slot)."""

    payloads: Sequence[Any] = ()
    bad: dict[int, str] = field(default_factory=dict)
    load: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Open:
    """Read ``bucket`` (``doc``, as claimed) as its claimant: reply: an ``Opened``, or why it cannot (a codec it
    does not read, attempts used up: the bucket goes to quarantine)."""

    bucket: StoredBucket
    doc: dict[str, Any]


@dataclass(frozen=True)
class ReadKnownKeys:
    """Which of ``keys`` were processed already (the dedupe inbox); reply: a collection of them."""

    keys: list[str]


@dataclass(frozen=True)
class Hold:
    """Hold ``held`` (opened as ``opened``): serve it, hand it out; reply: not used."""

    held: ClaimedBucket
    opened: Opened
    doc: dict[str, Any]


ClaimStep = ReadPause | ReadClock | ReadPartitions | Claim | Quarantine | Open | ReadKnownKeys | Hold | GroupStep


class Outcome(enum.Enum):
    """What became of a claim step's claim."""

    PAUSED = "paused"  # claimed nothing: an operator paused the queue
    NONE_DUE = "none due"
    UNCLAIMABLE = "unclaimable"  # claimed uncounted and sent to quarantine
    QUARANTINED = "quarantined"  # malformed, unreadable or undecodable: sent to quarantine
    WAITING = "waiting"  # an ordered group's bucket, released to wait for the group's turn
    HELD = "held"


@dataclass(frozen=True)
class Claimed:
    """What a claim step did. ``held``: the bucket held (``Outcome.HELD``); ``stored``: whether a quarantine copy
    was stored (False: the lease was lost first); ``instead``: the claim of the ordered group's earliest live
    bucket made because the group was free; ``expired_by``: the claim's earliest reading of the server's clock."""

    outcome: Outcome
    expired_by: dt.datetime | None = None
    doc: dict[str, Any] | None = None
    held: ClaimedBucket | None = None
    stored: bool = False
    instead: Claimed | None = None

    @property
    def taken(self) -> bool:
        """Whether a bucket was claimed (held, sent to quarantine, or waiting for its group's turn)."""
        return self.outcome not in (Outcome.PAUSED, Outcome.NONE_DUE)


@dataclass(frozen=True)
class Claimer:
    """Who claims, and how: ``owner`` (``claims.owner_name``) under ``policy``'s lease; ``ordered``: serves ordered
    groups (else their buckets are skipped: ``claims.ungrouped``); ``quarantine_malformed``: a bucket with an
    undecodable message goes to quarantine whole (else that message alone); ``dedupe``: known keys are skipped."""

    owner: str
    policy: Policy
    ordered: bool = True
    quarantine_malformed: bool = False
    dedupe: bool = False


def claim(claimer: Claimer, rotation: Rotation, turns: Turns, *, token: str | None = None,
          hinted: Sequence[int] = (), only: dict | None = None, groups_held: Collection[str] = (),
          check_pause: bool = True) -> Generator[ClaimStep, Any, Claimed]:
    """Claim one due bucket and follow its claim up. ``token``: the claim's (None: a new one); ``hinted``: the
    partitions to try first; ``only``: the bucket of that shard key, if due; ``groups_held``: the ordered groups
    whose turn the claimant holds (their later buckets can only wait); ``check_pause``: read the pause first (a
    batch reads it for its first claim only: the others fill the batch it began)."""
    if check_pause and (yield ReadPause()):
        return Claimed(Outcome.PAUSED)
    now, expired_by = yield ReadClock()
    token = token or claims.new_token()
    sort = turns.sort()  # by priority, or by age to keep lower levels from starving
    partitions = yield ReadPartitions()
    doc = unclaimable = None
    for partition in rotation.round(partitions, first=list(hinted)) if only is None else [only["pt"]]:
        spec = claims.claim(now, claimer.policy.lease, token, claimer.owner, expired_by=expired_by,
                            partition=partition, sort=sort)
        spec = groups.skip(spec, list(groups_held)) if claimer.ordered else claims.ungrouped(spec)
        if only is not None:
            spec = groups.instead(spec, only)
        doc, unclaimable = yield Claim(spec)
        if doc is not None:
            rotation.claimed(partition)
            if only is None:
                turns.took(sort)
            break
    if doc is None:
        return Claimed(Outcome.NONE_DUE, expired_by)
    if unclaimable is not None:
        return Claimed(Outcome.UNCLAIMABLE, expired_by, doc, stored=(yield Quarantine(doc, token, unclaimable)))
    try:
        bucket = parse_bucket(doc)
    except MalformedBucket as exc:
        return Claimed(Outcome.QUARANTINED, expired_by, doc, stored=(yield Quarantine(doc, token, str(exc))))
    opened = yield Open(bucket, doc)
    if isinstance(opened, str):
        return Claimed(Outcome.QUARANTINED, expired_by, doc, stored=(yield Quarantine(doc, token, opened)))
    if opened.bad and claimer.quarantine_malformed:
        first = ", ".join(f"slot {s}: {reason}" for s, reason in list(opened.bad.items())[:3])
        reason = f"{len(opened.bad)} undecodable message(s) ({first})"
        return Claimed(Outcome.QUARANTINED, expired_by, doc, stored=(yield Quarantine(doc, token, reason)))
    lease_until = claimer.policy.lease_from(now)
    if bucket.group is not None:
        turn = yield from group_turn.take_turn(bucket, token, now, lease_until, expired_by, waited=bool(doc.get("w")))
        if not turn.serve:
            instead = None
            if only is None and turn.claim_instead is not None:  # the ordered group was free: serve its first
                instead = yield from claim(claimer, rotation, turns, only=turn.claim_instead, groups_held=groups_held)
            return Claimed(Outcome.WAITING, expired_by, doc, instead=instead)
    held = ClaimedBucket(bucket, token, lease_until, claimer.policy)
    for slot, reason in opened.bad.items():
        held.quarantine(slot, f"undecodable: {reason}")
    held.end_cancelled()
    if claimer.dedupe:
        keyed = {k: s for s, k in enumerate(bucket.keys) if k is not None and held.state[s] is SlotState.PENDING}
        for key in (yield ReadKnownKeys(list(keyed))):
            held.ack(keyed[key])
    yield Hold(held, opened, doc)
    return Claimed(Outcome.HELD, expired_by, doc, held)

"""Streams, sans I/O: the stream bucket document, positions, the sequence counter, hole filling, reader groups
(claims, commits, resets), retention and lag. The rules are in docs/FORMAT.md (Streams).

A stream ``S`` keeps its buckets in the collection ``S`` with ``_id`` = *sequence*, an int allocated by ``$inc`` on
the counter document in ``S.seq`` (one round trip per write of up to 8 buckets, no lock held while writing), so
buckets of concurrent writes may land out of order, or never (a producer killed between allocation and insert).
A message's *position* is ``(sequence, slot)``. A reader never commits past a sequence whose document is missing:
once a sequence is allocated (counter past it) and still missing ``gap_wait`` seconds after a reader first saw it
so, the reader inserts a *gap marker* under that ``_id``. ``_id`` is unique, so exactly one of the producer's
bucket and the gap marker is ever stored: a producer insert arriving later fails as a duplicate whose ``b`` is
not its own, and its pushes fail with ``WriteFailed``; never is a message stored behind a committed position.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bson import ObjectId

from bucketq.core.format import FORMAT_VERSION, MAX_COUNT, as_utc
from bucketq.errors import InvalidOption, MalformedBucket

COUNTER_ID = "seq"
FIRST_SEQUENCE = 1
SCAN_BUCKETS = 64  # buckets a reader looks at past its group's committed position per scan
NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)  # an expired lease's ``until``


class Position(NamedTuple):
    """Where a message sits in a stream: its bucket's sequence and its slot. Ordered like the stream; its
    text form is ``"<sequence>:<slot>"``. A group's committed position is the first one it has not read."""

    seq: int
    slot: int = 0

    def __str__(self) -> str:
        return f"{self.seq}:{self.slot}"

    @classmethod
    def parse(cls, value: Position | str | tuple[int, int]) -> Position:
        """A Position from itself, ``"<sequence>:<slot>"``, ``"<sequence>"`` or a pair; ``InvalidOption`` else."""
        if isinstance(value, str):
            seq, _, slot = value.partition(":")
            try:
                value = (int(seq), int(slot or 0))
            except ValueError:
                raise InvalidOption(f"a position is '<sequence>:<slot>', got {value!r}") from None
        if (not isinstance(value, tuple) or len(value) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                or not (0 <= value[0] <= 2**62 and 0 <= value[1] < 65536)):
            raise InvalidOption(f"a position is a pair of a sequence (0 to 2**62) and a slot (0 to 65535), "
                                f"got {value!r}")
        return cls(*value)


# -- producer ------------------------------------------------------------------------------------------------

def allocate(count: int) -> tuple[dict, dict]:
    """(filter, update) for findOneAndUpdate(upsert, return after): reserve ``count`` sequences. The last one
    reserved is the counter's new ``last``; the first is ``last - count + 1``."""
    return {"_id": COUNTER_ID}, {"$inc": {"last": count}}


def stream_bucket(sealed: Mapping[str, Any]) -> dict[str, Any]:
    """The stream bucket holding the slots of a bucket the producer's accumulator sealed, once its sequence is
    its ``_id`` and its own ObjectId moved to ``b`` (so that a retried insert can tell its document from a gap
    marker). The queue-only fields (due, done, c, lease) go; ``bytes`` (payload bytes) serves size retention."""
    payloads = sealed["p"]
    doc: dict[str, Any] = {"_id": sealed["_id"], "v": FORMAT_VERSION, "b": sealed["b"], "enc": sealed["enc"],
                           "created": sealed["created"], "n": sealed["n"], "p": payloads,
                           "bytes": sum(len(p) for p in payloads)}
    for per_slot in ("h", "k"):
        if per_slot in sealed:
            doc[per_slot] = sealed[per_slot]
    return doc


def own_bucket(seq: int, bucket_id: ObjectId) -> dict:
    """Matches the bucket at ``seq`` only if this producer's insert stored it (not a gap marker)."""
    return {"_id": seq, "b": bucket_id}


def gap_marker(seq: int, now: dt.datetime, owner: str) -> dict[str, Any]:
    """What a reader stores at a sequence that was allocated but never written in time: no message ever will be."""
    return {"_id": seq, "v": FORMAT_VERSION, "gap": True, "created": now, "by": owner}


@dataclass
class HoleWatch:
    """When each missing sequence was first seen allocated-and-missing (monotonic seconds), to fill it with a
    gap marker once ``gap_wait`` has passed since. Local to one reader: another reader's clock starts on its
    own, which only makes it wait longer."""

    gap_wait: float
    first_seen: dict[int, float] = field(default_factory=dict)

    def due(self, missing: Iterable[int], now_mono: float) -> list[int]:
        """The missing sequences to mark as gaps now; forgets those no longer missing."""
        missing = set(missing)
        self.first_seen = {s: t for s, t in self.first_seen.items() if s in missing}
        for seq in missing:
            self.first_seen.setdefault(seq, now_mono)
        return sorted(s for s, t in self.first_seen.items() if now_mono - t >= self.gap_wait)


def missing_sequences(start: int, present: Iterable[int], last_allocated: int, limit: int = SCAN_BUCKETS) -> list[int]:
    """Allocated sequences from ``start`` (up to ``limit`` of them) with no document."""
    have = set(present)
    return [s for s in range(start, min(last_allocated, start + limit - 1) + 1) if s not in have]


# -- reader groups ------------------------------------------------------------------------------------------

def join_group(name: str, start: Position, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update) for an upsert: the group, created reading from ``start`` if it does not exist. ``e``
    (epoch) counts resets: claims of an older epoch are ignored."""
    return {"_id": name}, {"$setOnInsert": {"e": 0, "s": start.seq, "i": start.slot, "at": now, "created": now,
                                            "expired": 0}}


def reset_update(start: Position, now: dt.datetime) -> dict:
    """Move a group to ``start``: a new epoch, so that every claim made before counts for nothing."""
    return {"$set": {"s": start.seq, "i": start.slot, "at": now}, "$inc": {"e": 1},
            "$setOnInsert": {"created": now, "expired": 0}}


def check_group_name(name: object) -> str:
    if not isinstance(name, str) or not name or "\0" in name or len(name.encode()) > 200:
        raise InvalidOption(f"a group name is a non-empty string of at most 200 bytes without NUL, got {name!r}")
    return name


@dataclass(frozen=True)
class GroupState:
    """A group as stored: its epoch and committed position (the first position it has not read)."""

    name: str
    epoch: int
    committed: Position
    expired: int

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> GroupState:
        try:
            return cls(doc["_id"], int(doc["e"]), Position(int(doc["s"]), int(doc["i"])), int(doc.get("expired", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedBucket(f"group document {doc.get('_id')!r} is malformed: {exc}") from None


def claim_id(group: GroupState, seq: int) -> dict[str, Any]:
    return {"g": group.name, "e": group.epoch, "s": seq}


def claim(group: GroupState, seq: int, now: dt.datetime, lease_s: float, token: str,
          owner: str) -> tuple[dict, dict]:
    """(filter, update) for findOneAndUpdate(upsert, return after): the group's claim on bucket ``seq``, unless it
    is finished or another reader's lease on it is live. Two readers upserting at once: one gets a duplicate key
    error and takes nothing. A bucket at the committed position starts with the slots before it done."""
    until = now + dt.timedelta(seconds=lease_s)
    skipped = list(range(group.committed.slot)) if seq == group.committed.seq else []
    return ({"_id": claim_id(group, seq), "fin": False, "lease.until": {"$lt": now}},
            {"$set": {"lease": {"token": token, "owner": owner, "until": until}},
             "$setOnInsert": {"g": group.name, "e": group.epoch, "s": seq, "done": skipped}})


def claimed_by(cid: Mapping[str, Any], token: str) -> dict:
    return {"_id": dict(cid), "lease.token": token}


def extend_claim(until: dt.datetime, done: list[int]) -> dict:
    """Record ``done`` slots and move the lease's end to ``until`` (``NEVER``: hand the bucket back)."""
    update: dict[str, Any] = {"$set": {"lease.until": until}}
    if done:
        update["$addToSet"] = {"done": {"$each": sorted(done)}}
    return update


def finish_claim(token: str, done: list[int]) -> dict:
    """The group has read every message of the bucket: its claim is final (``fin``), whatever happens to leases."""
    return {"$set": {"fin": True, "by": token, "lease.until": NEVER}, "$addToSet": {"done": {"$each": sorted(done)}}}


def finished_by(cid: Mapping[str, Any], token: str) -> dict:
    return {"_id": dict(cid), "fin": True, "by": token}


def advance(start: int, present: Iterable[int], settled: Iterable[int]) -> int:
    """The group's new committed sequence: past every sequence from ``start`` on, in order, whose document
    exists and is settled (a gap marker, or a bucket whose claim is finished). It stops at the first missing or
    unfinished one, so it never passes a bucket that may still land or still has unread messages."""
    have, done = set(present), set(settled)
    seq = start
    while seq in have and seq in done:
        seq += 1
    return seq


def commit(group: GroupState, seq: int, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update): move the group's committed position forward to ``(seq, 0)``, within its epoch only and
    never backwards (concurrent readers may commit from older snapshots)."""
    return ({"_id": group.name, "e": group.epoch, "s": {"$lt": seq}}, {"$set": {"s": seq, "i": 0, "at": now}})


@dataclass
class HeldBucket:
    """A bucket a reader holds under its group's claim: which slots were delivered, acked, and written."""

    seq: int
    epoch: int
    cid: dict[str, Any]
    token: str
    codec: str
    payloads: list[str | bytes]
    headers: list[dict[str, Any] | None]
    created: dt.datetime
    done: set[int]  # acked (or skipped) and written to the claim
    next_slot: int = 0
    acked: set[int] = field(default_factory=set)  # acked, not yet written

    @classmethod
    def parse(cls, doc: Mapping[str, Any], claim_doc: Mapping[str, Any], epoch: int, token: str) -> HeldBucket:
        payloads = doc.get("p")
        if doc.get("v") != FORMAT_VERSION or not isinstance(payloads, list) or doc.get("n") != len(payloads) \
                or not payloads or not isinstance(doc.get("enc"), str):
            raise MalformedBucket(f"stream bucket {doc.get('_id')!r} does not match format version {FORMAT_VERSION}")
        headers = doc.get("h") or [None] * len(payloads)
        held = cls(seq=doc["_id"], epoch=epoch, cid=dict(claim_doc["_id"]), token=token, codec=doc["enc"],
                   payloads=payloads, headers=headers, created=as_utc(doc["created"]),
                   done={i for i in claim_doc.get("done", []) if isinstance(i, int)})
        held.next_slot = 0
        return held

    @property
    def size(self) -> int:
        return len(self.payloads)

    def take(self, n: int) -> list[int]:
        """Up to ``n`` slots not yet delivered nor done, in order."""
        out: list[int] = []
        while self.next_slot < self.size and len(out) < n:
            if self.next_slot not in self.done:
                out.append(self.next_slot)
            self.next_slot += 1
        return out

    @property
    def complete(self) -> bool:
        """Every slot acked or done. ``acked`` and ``done`` never share a slot (``take`` skips done slots,
        ``written`` moves acked ones over), so counting is enough: this runs on every ack."""
        return len(self.done) + len(self.acked) >= self.size

    def unwritten(self) -> list[int]:
        return sorted(self.acked - self.done)

    def written(self, slots: Iterable[int]) -> None:
        self.done.update(slots)
        self.acked.difference_update(self.done)


# -- retention and lag --------------------------------------------------------------------------------------

@dataclass
class RetentionCut:
    """Fed the buckets newest first (``take``), finds the floor: the oldest sequence to keep, so that what is
    kept is younger than ``max_age_s``, at most ``max_messages`` messages and ``max_bytes`` bytes (whichever
    bites first). Everything below the floor is deleted."""

    now: dt.datetime
    max_age_s: float | None
    max_messages: int | None
    max_bytes: int | None
    floor: int | None = None  # None: keep everything seen so far
    messages: int = 0
    bytes: int = 0

    def take(self, seq: int, created: dt.datetime, n: int, size: int) -> bool:
        """Account for bucket ``seq``; False once it falls out (and then the floor is ``seq + 1``): stop feeding."""
        self.messages += n
        self.bytes += size
        too_old = self.max_age_s is not None and as_utc(created) < self.now - dt.timedelta(seconds=self.max_age_s)
        if (too_old or (self.max_messages is not None and self.messages > self.max_messages)
                or (self.max_bytes is not None and self.bytes > self.max_bytes)):
            self.floor = seq + 1
            return False
        return True


def raise_floor(floor: int) -> tuple[dict, dict]:
    """(filter, update): the counter's retention ``floor`` moves up to ``floor``, never down."""
    return ({"_id": COUNTER_ID, "$or": [{"floor": {"$lt": floor}}, {"floor": {"$exists": False}}]},
            {"$set": {"floor": floor}})


def retired(floor: int, now: dt.datetime, keep_gaps_s: float) -> dict:
    """The documents retention deletes: every bucket below the floor, and the gap markers below it made more than
    ``keep_gaps_s`` ago. A gap marker is the proof that its sequence holds no message: kept as long as a
    producer's insert of that sequence may still arrive (``tombstone_retention``, more than any
    ``write_timeout``), it keeps such a late insert from landing, below the floor, where no group reads it."""
    return {"_id": {"$lt": floor},
            "$or": [{"gap": {"$ne": True}}, {"created": {"$lt": now - dt.timedelta(seconds=keep_gaps_s)}}]}


def claims_behind(group: GroupState) -> dict:
    """The group's claims that count for nothing any more: of another epoch, or behind its committed sequence."""
    return {"g": group.name, "$or": [{"e": {"$ne": group.epoch}}, {"s": {"$lt": group.committed.seq}}]}


def expire_update(group: GroupState, floor: int, lost: int, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update): a group whose committed position fell below the retention floor jumps to it, and
    counts the messages it never read in ``expired``."""
    return ({"_id": group.name, "e": group.epoch, "s": group.committed.seq},
            {"$set": {"s": floor, "i": 0, "at": now}, "$inc": {"expired": min(lost, MAX_COUNT)}})


def lag(group: GroupState, buckets: Iterable[Mapping[str, Any]], settled_slots: Mapping[int, int],
        now: dt.datetime) -> dict[str, Any]:
    """A group's lag: messages at or past its committed position not yet read and acked (``lag_messages``) and
    the age of the oldest of them (``lag_s``, 0 when caught up). ``buckets`` are the stream's buckets (``_id``,
    ``n``, ``created``) from the committed sequence on; ``settled_slots`` the slots the group's claims record
    as done, by sequence."""
    messages = 0
    oldest: dt.datetime | None = None
    for doc in buckets:
        if doc.get("gap"):
            continue
        seq, n = doc["_id"], doc["n"]
        skipped = group.committed.slot if seq == group.committed.seq else 0
        unread = n - max(skipped, settled_slots.get(seq, 0))
        if unread > 0:
            messages += unread
            created = as_utc(doc["created"])
            oldest = created if oldest is None or created < oldest else oldest
    return {"position": str(group.committed), "lag_messages": messages,
            "lag_s": max(0.0, (now - oldest).total_seconds()) if oldest else 0.0, "expired": group.expired}

"""Streams, sans I/O: the stream bucket document, positions, the sequence counter, hole filling, reader groups
(claims, commits, resets), retention and lag. The rules are in docs/FORMAT.md (Streams).

A stream ``S`` keeps its buckets in the collection ``S`` with ``_id`` = *sequence*, an int allocated by ``$inc`` on
the counter document in ``S.seq`` (one round trip per write of up to 8 buckets, no lock held while writing), so
buckets of concurrent writes may land out of order, or never (a producer killed between allocation and insert).
A stream of ``partitions > 1`` (format version 2) has one such sequence per partition: its buckets carry ``pt``
and ``s`` (unique together, the shard key) and every rule below holds per partition (``Partition`` says where a
partition's documents are). A message's *position* is ``(sequence, slot)`` in its partition.
A reader never commits past a sequence whose document is missing: once a sequence is allocated (counter past
it) and still missing ``gap_wait`` seconds after a reader first saw it so, the reader inserts a *gap marker*
under that ``_id``. ``_id`` is unique, so exactly one of the producer's bucket and the gap marker is ever
stored: a producer insert arriving later fails as a duplicate whose ``b`` is not its own, and its pushes fail
with ``WriteFailed``; never is a message stored behind a committed position.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bson import ObjectId

from bucketq.core.format import FORMAT_VERSION, MAX_COUNT, as_utc, payload_size
from bucketq.core.sharding import MAX_PARTITIONS
from bucketq.errors import InvalidOption, MalformedBucket

COUNTER_ID = "seq"
LAYOUT_ID = "layout"  # in ``S.seq``: a partitioned stream's version and partition count
PARTITIONED_VERSION = 2  # the format version of a partitioned stream's documents
STREAM_SHARD_KEYS = {"": {"pt": 1, "s": 1}}  # by collection suffix; the side collections stay unsharded
FIRST_SEQUENCE = 1
SCAN_BUCKETS = 64  # buckets a reader looks at past its group's committed position per scan
NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)  # an expired lease's ``until``


class Position(NamedTuple):
    """Where a message sits in a stream: its bucket's sequence and its slot, in its ``partition`` (0 in a stream
    of one partition). Within a partition ordered like the stream; its text form is ``"<sequence>:<slot>"``, or
    ``"<partition>/<sequence>:<slot>"`` in a partition other than 0. A group's committed position (one per
    partition) is the first one it has not read."""

    seq: int
    slot: int = 0
    partition: int = 0

    def __str__(self) -> str:
        return f"{self.partition}/{self.seq}:{self.slot}" if self.partition else f"{self.seq}:{self.slot}"

    @classmethod
    def parse(cls, value: Position | str | tuple[int, ...]) -> Position:
        """A Position from itself, ``"[<partition>/]<sequence>[:<slot>]"``, a pair (sequence, slot) or a triple
        (sequence, slot, partition); ``InvalidOption`` else."""
        if isinstance(value, str):
            partition, _, rest = value.rpartition("/")
            seq, _, slot = rest.partition(":")
            try:
                value = (int(seq), int(slot or 0), int(partition or 0))
            except ValueError:
                raise InvalidOption(f"a position is '[<partition>/]<sequence>:<slot>', got {value!r}") from None
        if (not isinstance(value, tuple) or len(value) not in (2, 3)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                or not (0 <= value[0] <= 2**62 and 0 <= value[1] < 65536)
                or len(value) == 3 and not 0 <= value[2] < MAX_PARTITIONS):
            raise InvalidOption(f"a position is a sequence (0 to 2**62), a slot (0 to 65535) and a partition "
                                f"(0 to {MAX_PARTITIONS - 1}, 0 when left out), got {value!r}")
        return cls(*value)


@dataclass(frozen=True)
class Partition:
    """Where the documents of one partition of a stream of ``of`` partitions are, in each collection. A stream
    of one partition keeps format version 1: bucket ``_id`` = sequence, one counter ``"seq"``, a group's ``s``
    and ``i`` are ints. Of more: version 2, buckets ``{pt, s}`` (the shard key; ``_id`` ``"<pt>/<s>"``), counters
    ``"seq.<pt>"``, a group's ``s`` and ``i`` are arrays indexed by partition, claims keyed by ``pt`` too."""

    number: int = 0
    of: int = 1

    @property
    def partitioned(self) -> bool:
        return self.of > 1

    @property
    def version(self) -> int:
        return PARTITIONED_VERSION if self.partitioned else FORMAT_VERSION

    @property
    def seq_field(self) -> str:
        """The field of ``S`` holding a document's sequence."""
        return "s" if self.partitioned else "_id"

    def seqs(self, condition: Any) -> dict[str, Any]:
        """A filter on ``S``: this partition's documents whose sequence matches ``condition``."""
        return {"pt": self.number, "s": condition} if self.partitioned else {"_id": condition}

    def seq_of(self, doc: Mapping[str, Any]) -> int:
        return int(doc[self.seq_field])

    def doc_fields(self, seq: int) -> dict[str, Any]:
        """Where a document of ``S`` at ``seq`` is: version 1, ``_id`` = sequence; version 2, ``pt`` and ``s``,
        and ``_id`` = ``"<pt>/<s>"``. Either way ``_id`` is unique for a sequence of the partition (on a sharded
        cluster ``_id`` is unique per shard, and every ``{pt, s}`` lives on one shard, its chunk's)."""
        if self.partitioned:
            return {"_id": f"{self.number}/{seq}", "pt": self.number, "s": seq}
        return {"_id": seq}

    @property
    def counter_id(self) -> str:
        return f"{COUNTER_ID}.{self.number}" if self.partitioned else COUNTER_ID

    def group_field(self, name: str) -> str:
        """A group document's ``s`` or ``i`` of this partition."""
        return f"{name}.{self.number}" if self.partitioned else name

    def label(self, seq: int) -> str | int:
        """What a pushed message's position starts with (``"<label>:<slot>"``)."""
        return f"{self.number}/{seq}" if self.number else seq


def partitions_of(count: int) -> list[Partition]:
    return [Partition(number, count) for number in range(count)]


def layout_doc(partitions: int) -> tuple[dict, dict]:
    """(filter, update) for an upsert in ``S.seq``: a partitioned stream's layout, written once."""
    return {"_id": LAYOUT_ID}, {"$setOnInsert": {"v": PARTITIONED_VERSION, "partitions": partitions}}


def stored_partitions(layout: Mapping[str, Any] | None, has_counter: bool, wanted: int | None) -> int:
    """The stream's partition count: its layout's, 1 for a version-1 stream (a counter but no layout), else
    ``wanted`` (a new stream; default 1). ``InvalidOption`` when ``wanted`` differs from what is stored."""
    stored = int(layout["partitions"]) if layout else 1 if has_counter else None
    if stored is not None and wanted is not None and wanted != stored:
        what = "a version-1 stream (one sequence)" if not layout else f"partitioned in {stored}"
        raise InvalidOption(f"the stream is {what}: partitions={wanted} cannot apply; a stream's partitions are "
                            f"fixed when it is created (push to a new stream to change them)")
    return stored if stored is not None else wanted or 1


# -- producer ------------------------------------------------------------------------------------------------

def allocate(part: Partition, count: int) -> tuple[dict, dict]:
    """(filter, update) for findOneAndUpdate(upsert, return after): reserve ``count`` sequences of ``part``. The
    last one reserved is the counter's new ``last``; the first is ``last - count + 1``."""
    return {"_id": part.counter_id}, {"$inc": {"last": count}}


def stream_bucket(sealed: Mapping[str, Any], part: Partition) -> dict[str, Any]:
    """The stream bucket holding the slots of a bucket the producer's accumulator sealed, once its sequence is
    ``s`` and its own ObjectId moved to ``b`` (so that a retried insert can tell its document from a gap
    marker). The queue-only fields (due, done, c, lease) go; ``bytes`` (payload bytes) serves size retention.
    Where it is: ``Partition.doc_fields``."""
    payloads = sealed["p"]
    doc: dict[str, Any] = {**part.doc_fields(sealed["s"]), "v": part.version, "b": sealed["b"], "enc": sealed["enc"],
                           "created": sealed["created"], "n": sealed["n"], "p": payloads,
                           "bytes": sum(map(payload_size, payloads))}
    for per_slot in ("h", "k"):
        if per_slot in sealed:
            doc[per_slot] = sealed[per_slot]
    return doc


def own_bucket(part: Partition, seq: int, bucket_id: ObjectId) -> dict:
    """Matches the bucket at ``seq`` only if this producer's insert stored it (not a gap marker)."""
    return {**part.seqs(seq), "b": bucket_id}


def gap_marker(part: Partition, seq: int, now: dt.datetime, owner: str) -> dict[str, Any]:
    """What a reader stores at a sequence that was allocated but never written in time: no message ever will be."""
    return {**part.doc_fields(seq), "v": part.version, "gap": True, "created": now, "by": owner}


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

    def next_at(self) -> float | None:
        """The monotonic time at which the first hole watched becomes due (None: none is watched)."""
        return min(self.first_seen.values()) + self.gap_wait if self.first_seen else None


def missing_sequences(start: int, present: Iterable[int], last_allocated: int, limit: int = SCAN_BUCKETS) -> list[int]:
    """Allocated sequences from ``start`` (up to ``limit`` of them) with no document."""
    have = set(present)
    return [s for s in range(start, min(last_allocated, start + limit - 1) + 1) if s not in have]


# -- reader groups ------------------------------------------------------------------------------------------

def _positions_fields(start: list[Position]) -> dict[str, Any]:
    """A group's ``s`` and ``i``: ints for one partition (version 1), arrays by partition for more."""
    if len(start) == 1:
        return {"s": start[0].seq, "i": start[0].slot}
    return {"v": PARTITIONED_VERSION, "s": [p.seq for p in start], "i": [p.slot for p in start]}


def join_group(name: str, start: list[Position], now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update) for an upsert: the group, created reading from ``start`` (one position per partition)
    if it does not exist. ``e`` (epoch) counts resets: claims of an older epoch are ignored."""
    return {"_id": name}, {"$setOnInsert": {"e": 0, **_positions_fields(start), "at": now, "created": now,
                                            "expired": 0}}


def reset_update(start: list[Position], now: dt.datetime) -> dict:
    """Move a group to ``start`` (one position per partition): a new epoch, so that every claim made before
    counts for nothing."""
    return {"$set": {**_positions_fields(start), "at": now}, "$inc": {"e": 1},
            "$setOnInsert": {"created": now, "expired": 0}}


def spread_group(group: GroupState, parts: list[Partition]) -> tuple[dict, dict]:
    """(filter, update): a group of one position, created (by a reader or a reset) before its stream existed,
    moved to the stream's partitions, each at that position (a new stream's "beginning" and "end" are both
    sequence 1). Applied once: the filter matches only the group's single-position shape and epoch."""
    start = group.committed
    return ({"_id": group.name, "e": group.epoch, "v": {"$exists": False}},
            {"$set": _positions_fields([Position(start.seq, start.slot, p.number) for p in parts])})


def check_group_name(name: object) -> str:
    if not isinstance(name, str) or not name or "\0" in name or len(name.encode()) > 200:
        raise InvalidOption(f"a group name is a non-empty string of at most 200 bytes without NUL, got {name!r}")
    return name


@dataclass(frozen=True)
class GroupState:
    """A group as stored: its epoch and committed positions (per partition, the first position it has not read)."""

    name: str
    epoch: int
    positions: tuple[Position, ...]
    expired: int

    @property
    def committed(self) -> Position:
        """The committed position of a stream of one partition (of partition 0 otherwise)."""
        return self.positions[0]

    def at(self, part: Partition) -> Position:
        """The committed position in ``part``; a group of one position not spread yet (``spread_group``) is at
        that position in every partition."""
        if len(self.positions) == 1:
            return self.committed._replace(partition=part.number)
        return self.positions[part.number]

    def __str__(self) -> str:
        """The committed positions as text, separated by spaces."""
        return " ".join(str(p) for p in self.positions)

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> GroupState:
        try:
            seqs, slots = doc["s"], doc["i"]
            if isinstance(seqs, list) and isinstance(slots, list) and len(seqs) == len(slots):
                pairs = enumerate(zip(seqs, slots, strict=True))
                positions = tuple(Position(int(s), int(i), pt) for pt, (s, i) in pairs)
            else:
                positions = (Position(int(seqs), int(slots)),)
            return cls(doc["_id"], int(doc["e"]), positions, int(doc.get("expired", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedBucket(f"group document {doc.get('_id')!r} is malformed: {exc}") from None


def claim_id(group: GroupState, part: Partition, seq: int) -> dict[str, Any]:
    if part.partitioned:
        return {"g": group.name, "e": group.epoch, "pt": part.number, "s": seq}
    return {"g": group.name, "e": group.epoch, "s": seq}


def claim(group: GroupState, part: Partition, seq: int, now: dt.datetime, lease_s: float, token: str,
          owner: str) -> tuple[dict, dict]:
    """(filter, update) for findOneAndUpdate(upsert, return after): the group's claim on bucket ``seq`` of
    ``part``, unless it is finished or another reader's lease on it is live. Two readers upserting at once: one
    gets a duplicate key error and takes nothing. A bucket at the committed position starts with the slots
    before it done."""
    until = now + dt.timedelta(seconds=lease_s)
    committed = group.at(part)
    skipped = list(range(committed.slot)) if seq == committed.seq else []
    cid = claim_id(group, part, seq)
    return ({"_id": cid, "fin": False, "lease.until": {"$lt": now}},
            {"$set": {"lease": {"token": token, "owner": owner, "until": until}},
             "$setOnInsert": {**cid, "done": skipped}})


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


def commit(group: GroupState, part: Partition, seq: int, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update): move the group's committed position in ``part`` forward to ``(seq, 0)``, within its
    epoch only and never backwards (concurrent readers may commit from older snapshots)."""
    s, i = part.group_field("s"), part.group_field("i")
    return ({"_id": group.name, "e": group.epoch, s: {"$lt": seq}}, {"$set": {s: seq, i: 0, "at": now}})


@dataclass
class HeldStreamBucket:
    """A bucket a reader holds under its group's claim: which slots were delivered, acked, and written."""

    seq: int
    partition: int
    epoch: int
    cid: dict[str, Any]
    token: str
    codec: str
    payloads: list[str | bytes | Mapping[str, Any]]
    headers: list[dict[str, Any] | None]
    created: dt.datetime
    done: set[int]  # acked (or skipped) and written to the claim
    next_slot: int = 0
    acked: set[int] = field(default_factory=set)  # acked, not yet written

    @classmethod
    def parse(cls, doc: Mapping[str, Any], part: Partition, claim_doc: Mapping[str, Any], epoch: int,
              token: str) -> HeldStreamBucket:
        payloads = doc.get("p")
        if (doc.get("v") != part.version or not isinstance(payloads, list) or doc.get("n") != len(payloads)
                or not payloads or not isinstance(doc.get("enc"), str)
                or part.partitioned and doc.get("pt") != part.number):
            raise MalformedBucket(f"stream bucket {doc.get('_id')!r} does not match format version {part.version}")
        headers = doc.get("h") or [None] * len(payloads)
        held = cls(seq=part.seq_of(doc), partition=part.number, epoch=epoch, cid=dict(claim_doc["_id"]),
                   token=token, codec=doc["enc"],
                   payloads=payloads, headers=headers, created=as_utc(doc["created"]),
                   done={i for i in claim_doc.get("done", []) if isinstance(i, int)})
        held.next_slot = 0
        return held

    @property
    def size(self) -> int:
        return len(self.payloads)

    @property
    def position(self) -> Position:
        """Its first slot's position: what names the bucket."""
        return Position(self.seq, 0, self.partition)

    @property
    def key(self) -> tuple[int, int]:
        """(partition, sequence): what a reader holds it under."""
        return self.partition, self.seq

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


def raise_floor(part: Partition, floor: int) -> tuple[dict, dict]:
    """(filter, update): the partition's counter's retention ``floor`` moves up to ``floor``, never down."""
    return ({"_id": part.counter_id, "$or": [{"floor": {"$lt": floor}}, {"floor": {"$exists": False}}]},
            {"$set": {"floor": floor}})


def retired(part: Partition, floor: int, now: dt.datetime, keep_gaps_s: float) -> dict:
    """The documents retention deletes: every bucket below the floor, and the gap markers below it made more than
    ``keep_gaps_s`` ago. A gap marker is the proof that its sequence holds no message: kept as long as a
    producer's insert of that sequence may still arrive (``tombstone_retention``, more than any
    ``write_timeout``), it keeps such a late insert from landing, below the floor, where no group reads it."""
    return {**part.seqs({"$lt": floor}),
            "$or": [{"gap": {"$ne": True}}, {"created": {"$lt": now - dt.timedelta(seconds=keep_gaps_s)}}]}


def claims_behind(group: GroupState) -> dict:
    """The group's claims that count for nothing any more: of another epoch, or behind its committed sequence
    (in their partition)."""
    if len(group.positions) == 1:
        return {"g": group.name, "$or": [{"e": {"$ne": group.epoch}}, {"s": {"$lt": group.committed.seq}}]}
    return {"g": group.name, "$or": [{"e": {"$ne": group.epoch}},
                                     *({"e": group.epoch, "pt": p.partition, "s": {"$lt": p.seq}}
                                       for p in group.positions)]}


def expire_update(group: GroupState, part: Partition, floor: int, lost: int, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update): a group whose committed position in ``part`` fell below the retention floor jumps to
    it, and counts the messages it never read in ``expired``."""
    s, i = part.group_field("s"), part.group_field("i")
    return ({"_id": group.name, "e": group.epoch, s: group.at(part).seq},
            {"$set": {s: floor, i: 0, "at": now}, "$inc": {"expired": min(lost, MAX_COUNT)}})


@dataclass
class Lag:
    """A group's lag summed over its partitions (``add`` each): messages at or past its committed positions not
    yet read and acked, and when the oldest of them was pushed."""

    messages: int = 0
    oldest: dt.datetime | None = None

    def add(self, part: Partition, committed: Position, buckets: Iterable[Mapping[str, Any]],
            settled_slots: Mapping[int, int]) -> None:
        """``buckets``: the partition's documents (sequence, ``n``, ``created``, ``gap``) from the committed
        sequence on; ``settled_slots``: the slots the group's claims there record as done, by sequence."""
        for doc in buckets:
            if doc.get("gap"):
                continue
            seq, n = part.seq_of(doc), doc["n"]
            skipped = committed.slot if seq == committed.seq else 0
            unread = n - max(skipped, settled_slots.get(seq, 0))
            if unread > 0:
                self.messages += unread
                created = as_utc(doc["created"])
                self.oldest = created if self.oldest is None or created < self.oldest else self.oldest

    def report(self, group: GroupState, parts: list[Partition], now: dt.datetime) -> dict[str, Any]:
        """``position`` (the committed positions in ``parts`` as text), ``lag_messages``, ``lag_s`` (0 when caught
        up) and ``expired``."""
        return {"position": " ".join(str(group.at(p)) for p in parts), "lag_messages": self.messages,
                "lag_s": max(0.0, (now - self.oldest).total_seconds()) if self.oldest else 0.0,
                "expired": group.expired}

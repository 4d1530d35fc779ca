"""A stream's reader groups, sans I/O (docs/FORMAT.md, Reader groups): a group's stored state (its epoch and
committed positions, one per partition), joining, resetting and spreading it over partitions, and moving its
committed position forward. (Not the ordered groups of a queue: those are ``core.groups``.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bucketq.core.stream_format import PARTITIONED_VERSION, Partition, Position
from bucketq.errors import InvalidOption, MalformedBucket

SCAN_BUCKETS = 64  # buckets a reader looks at past its group's committed position per scan


def _positions_fields(start: list[Position]) -> dict[str, Any]:
    """A group's ``s`` and ``i``: ints for one partition (version 1), arrays by partition for more."""
    if len(start) == 1:
        return {"s": start[0].seq, "i": start[0].slot}
    return {"v": PARTITIONED_VERSION, "s": [p.seq for p in start], "i": [p.slot for p in start]}


def join(name: str, start: list[Position], now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update) for an upsert: the group, created reading from ``start`` (one position per partition)
    if it does not exist. ``e`` (epoch) counts resets: claims of an older epoch are ignored."""
    return {"_id": name}, {"$setOnInsert": {"e": 0, **_positions_fields(start), "at": now, "created": now,
                                            "expired": 0}}


def reset_update(start: list[Position], now: dt.datetime) -> dict:
    """Move a group to ``start`` (one position per partition): a new epoch, so that every claim made before
    counts for nothing."""
    return {"$set": {**_positions_fields(start), "at": now}, "$inc": {"e": 1},
            "$setOnInsert": {"created": now, "expired": 0}}


def spread(group: ReaderGroup, parts: list[Partition]) -> tuple[dict, dict]:
    """(filter, update): a group of one position, created (by a reader or a reset) before its stream existed,
    moved to the stream's partitions, each at that position (a new stream's "beginning" and "end" are both
    sequence 1). Applied once: the filter matches only the group's single-position shape and epoch."""
    start = group.committed
    return ({"_id": group.name, "e": group.epoch, "v": {"$exists": False}},
            {"$set": _positions_fields([Position(start.seq, start.slot, p.number) for p in parts])})


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name or "\0" in name or len(name.encode()) > 200:
        raise InvalidOption(f"a group name is a non-empty string of at most 200 bytes without NUL, got {name!r}")
    return name


@dataclass(frozen=True)
class ReaderGroup:
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
        """The committed position in ``part``; a group of one position not spread yet (``spread``) is at
        that position in every partition."""
        if len(self.positions) == 1:
            return self.committed._replace(partition=part.number)
        return self.positions[part.number]

    def __str__(self) -> str:
        """The committed positions as text, separated by spaces."""
        return " ".join(str(p) for p in self.positions)

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> ReaderGroup:
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


def advance(start: int, present: Iterable[int], settled: Iterable[int]) -> int:
    """The group's new committed sequence: past every sequence from ``start`` on, in order, whose document
    exists and is settled (a gap marker, or a bucket whose claim is finished). It stops at the first missing or
    unfinished one, so it never passes a bucket that may still land or still has unread messages."""
    have, done = set(present), set(settled)
    seq = start
    while seq in have and seq in done:
        seq += 1
    return seq


def commit(group: ReaderGroup, part: Partition, seq: int, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update): move the group's committed position in ``part`` forward to ``(seq, 0)``, within its
    epoch only and never backwards (concurrent readers may commit from older snapshots)."""
    s, i = part.group_field("s"), part.group_field("i")
    return ({"_id": group.name, "e": group.epoch, s: {"$lt": seq}}, {"$set": {s: seq, i: 0, "at": now}})

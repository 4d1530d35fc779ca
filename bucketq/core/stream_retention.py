"""A stream's retention, sans I/O: the floor under which its buckets go (by age, messages and bytes), the gap
markers kept below it a while, the claims that count for nothing any more, and the groups left behind the floor."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from bucketq.core.format import MAX_COUNT, as_utc
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition


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


def claims_behind(group: ReaderGroup) -> dict:
    """The group's claims that count for nothing any more: of another epoch, or behind its committed sequence
    (in their partition)."""
    if len(group.positions) == 1:
        return {"g": group.name, "$or": [{"e": {"$ne": group.epoch}}, {"s": {"$lt": group.committed.seq}}]}
    return {"g": group.name, "$or": [{"e": {"$ne": group.epoch}},
                                     *({"e": group.epoch, "pt": p.partition, "s": {"$lt": p.seq}}
                                       for p in group.positions)]}


def expire_update(group: ReaderGroup, part: Partition, floor: int, lost: int, now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update): a group whose committed position in ``part`` fell below the retention floor jumps to
    it, and counts the messages it never read in ``expired``."""
    s, i = part.group_field("s"), part.group_field("i")
    return ({"_id": group.name, "e": group.epoch, s: group.at(part).seq},
            {"$set": {s: floor, i: 0, "at": now}, "$inc": {"expired": min(lost, MAX_COUNT)}})

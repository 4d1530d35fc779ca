"""A reader group's lag, sans I/O: the messages at or past its committed positions not yet read and acked, and how
old the oldest is."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bucketq.core.format import as_utc
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition, Position


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

    def report(self, group: ReaderGroup, parts: list[Partition], now: dt.datetime) -> dict[str, Any]:
        """``position`` (the committed positions in ``parts`` as text), ``lag_messages``, ``lag_s`` (0 when caught
        up) and ``expired``."""
        return {"position": " ".join(str(group.at(p)) for p in parts), "lag_messages": self.messages,
                "lag_s": max(0.0, (now - self.oldest).total_seconds()) if self.oldest else 0.0,
                "expired": group.expired}

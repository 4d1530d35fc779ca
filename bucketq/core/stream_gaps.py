"""Hole filling in a stream, sans I/O: a reader never commits past a sequence whose document is missing (docs/FORMAT.md,
Streams). Once a sequence is allocated (counter past it) and still missing ``gap_wait`` seconds after a reader first
saw it so, the reader inserts a *gap marker* under that ``_id``. ``_id`` is unique, so exactly one of the producer's
bucket and the gap marker is ever stored: a producer insert arriving later fails as a duplicate whose ``b`` is not
its own, and its pushes fail with ``WriteFailed``; never is a message stored behind a committed position.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.reader_groups import SCAN_BUCKETS
from bucketq.core.stream_format import Partition


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

"""A stream reader's step in one partition, sans I/O: from what a scan of its group's window found (``Window``),
what to write next (move the committed position, the buckets to try to claim, the holes to mark as gaps) and
when to look again though nothing announces a change (a hole's ``gap_wait`` or another reader's lease runs out).
``bucketq.shell.stream_reader`` reads the window, hands it to ``step`` and runs the ``Step`` it gets back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bucketq.core.reader_groups import advance
from bucketq.core.stream_gaps import HoleWatch, missing_sequences


@dataclass(frozen=True)
class Window:
    """A scan of one partition from the group's committed sequence ``start``: the sequences whose document is
    there (buckets and gap markers), those settled (gap markers, buckets whose claim is finished), the live
    leases of the group's claims by sequence (their ``until``), and the last sequence the counter allocated."""

    start: int
    present: list[int]
    settled: frozenset[int]
    leases: Mapping[int, dt.datetime]
    last: int

    @classmethod
    def read(cls, start: int, last: int, present: list[int], gaps: Iterable[int],
             claims: Iterable[Mapping[str, Any]]) -> Window:
        """From the store's answers: the window's sequences, its gap markers' and the group's claims there
        (``s``, ``fin``, ``lease``)."""
        claims = list(claims)
        settled = frozenset(gaps) | {c["s"] for c in claims if c.get("fin")}
        leases = {c["s"]: c["lease"]["until"] for c in claims if not c.get("fin") and c.get("lease")}
        return cls(start, present, settled, leases, last)

    @property
    def committed(self) -> int:
        """The group's committed sequence once past what is settled from ``start`` on (``advance``)."""
        return advance(self.start, self.present, self.settled)


@dataclass(frozen=True)
class Step:
    """What to do in the partition, in order: ``commit`` (move the committed sequence there; None: it stays),
    try ``claims`` until one takes a bucket, else mark ``gaps``. Without a change stream event, look again by
    ``recheck_at`` (monotonic: a hole's ``gap_wait`` ends) or by ``lease_ends`` (server time: the first live
    lease of another reader ends, its bucket claimable again); None: no such time is known."""

    commit: int | None
    claims: list[int]
    gaps: list[int]
    recheck_at: float | None
    lease_ends: dt.datetime | None


def step(window: Window, held: Iterable[int], holes: HoleWatch, now: dt.datetime, now_mono: float) -> Step:
    """The reader's step in a partition: ``held``, the sequences this reader holds there; ``holes``, its watch of
    the partition's missing sequences (updated: it learns the holes seen now); ``now``, the earliest reading of the
    server's clock (a lease is over only when no reading says otherwise); ``now_mono``, the monotonic clock."""
    committed = window.committed
    mine = set(held)
    live = {seq: until for seq, until in window.leases.items() if until >= now}  # a claim needs until < now
    busy = window.settled | mine | live.keys()
    gaps = holes.due(missing_sequences(window.start, window.present, window.last), now_mono)
    foreign = [until for seq, until in live.items() if seq not in mine]
    return Step(commit=committed if committed > window.start else None,
                claims=[seq for seq in window.present if seq not in busy],
                gaps=gaps, recheck_at=holes.next_at(), lease_ends=min(foreign, default=None))

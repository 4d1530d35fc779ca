"""A reader group's conversations with a stream's store, sans-I/O: generators that yield the next store call (a
``ReadStep``) and take its reply back, h11 style (``core.conversation`` carries them). The stream reader
(``bucketq.stream_reader``) and the Spark batch (``bucketq_spark.stream.uncommitted_ranges``) carry them; the
rules live here, once (docs/FORMAT.md, Reader groups):

- ``current_group``: the group as stored; joined at its start when missing (deleted meanwhile), spread over the
  partitions when it was joined before the stream was partitioned;
- ``after_claim``: a claim stands only if the group, read again, is in the same epoch and has not committed past
  the bucket (else the claim may be a fresh one on a bucket finished meanwhile); a bucket deleted by retention is
  not held; one with every slot done is finished at once;
- ``finish``: a claim made final, fenced by the reader's token, then the group committed past what it settles when
  the bucket held it back;
- ``uncommitted``: the range a batch reads in a partition, up to the first sequence not stored yet; a hole at its
  start is waited on, then marked a gap once it waited ``gap_wait`` (the hole rule, ``HoleWatch``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from bucketq.core import reader_groups, stream_claims
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition, Position
from bucketq.core.stream_gaps import HoleWatch
from bucketq.core.stream_held import HeldStreamBucket
from bucketq.core.stream_step import Window
from bucketq.errors import LeaseLost


@dataclass(frozen=True)
class ReadGroup:
    """``store.group(name)``; reply: the ``ReaderGroup``, or None when it is missing."""


@dataclass(frozen=True)
class StartPositions:
    """Where the group starts when it joins (the reader's ``start``); reply: a ``Position`` per partition."""


@dataclass(frozen=True)
class ReadClock:
    """The server's time; reply: a datetime."""


@dataclass(frozen=True)
class ReadMonotonic:
    """The monotonic clock (``time.monotonic``); reply: a float."""


@dataclass(frozen=True)
class UpsertGroup:
    """``store.upsert_group(query, update)``; reply: None."""

    query: dict
    update: dict


@dataclass(frozen=True)
class MoveGroup:
    """``store.move_group(query, update)``; reply: whether it applied."""

    query: dict
    update: dict


@dataclass(frozen=True)
class ReadWindow:
    """``store.window(part, start, size)``; reply: the documents."""

    part: Partition
    start: int
    size: int


@dataclass(frozen=True)
class ReadClaims:
    """The claims of ``group``'s epoch in ``part`` from ``start`` on (``s``, ``fin``, ``lease``); reply: a list."""

    group: ReaderGroup
    part: Partition
    start: int


@dataclass(frozen=True)
class ReadCounter:
    """``store.counter_state(part)``; reply: (last sequence allocated, retention floor)."""

    part: Partition


@dataclass(frozen=True)
class ReadBucket:
    """``store.bucket(part, seq)``; reply: the document, or None."""

    part: Partition
    seq: int


@dataclass(frozen=True)
class UpdateClaim:
    """``store.update_claim(query, update, mine=mine)``; reply: whether it applied."""

    query: dict
    update: dict
    mine: dict | None


@dataclass(frozen=True)
class MarkGap:
    """Mark the hole ``seq`` of ``part`` a gap (``store.mark_gap``); reply: not used."""

    part: Partition
    seq: int


@dataclass(frozen=True)
class WaitForHole:
    """Nothing to read yet: a hole at the range's start, not yet due to be marked; wait a poll; reply: None."""


ReadStep = (ReadGroup | StartPositions | ReadClock | ReadMonotonic | UpsertGroup | MoveGroup | ReadWindow | ReadClaims
            | ReadCounter | ReadBucket | UpdateClaim | MarkGap | WaitForHole)
Conversation = Generator[ReadStep, Any, Any]


def join(name: str) -> Generator[ReadStep, Any, None]:
    """Create group ``name`` at its start positions, if it is missing (``reader_groups.join``)."""
    start = yield StartPositions()
    yield UpsertGroup(*reader_groups.join(name, start, (yield ReadClock())))


def current_group(name: str, parts: list[Partition]) -> Generator[ReadStep, Any, ReaderGroup]:
    """The group as stored: joined when missing (deleted meanwhile), spread over ``parts`` when it was joined before
    the stream was created partitioned (it has one position)."""
    while True:
        group: ReaderGroup | None = yield ReadGroup()
        if group is None:
            yield from join(name)
        elif len(group.positions) == 1 < len(parts):
            yield MoveGroup(*reader_groups.spread(group, parts))
        else:
            return group


def window(group: ReaderGroup, part: Partition, last: int = 0) -> Generator[ReadStep, Any, Window]:
    """The group's window in ``part`` (``stream_step.Window``): its documents and the group's claims there."""
    start = group.at(part).seq
    docs = yield ReadWindow(part, start, reader_groups.SCAN_BUCKETS)
    claims = yield ReadClaims(group, part, start)
    return Window.read(start, last, [part.seq_of(d) for d in docs], [part.seq_of(d) for d in docs if d.get("gap")],
                       claims)


def after_claim(name: str, parts: list[Partition], group: ReaderGroup, part: Partition, seq: int,
                claim: dict[str, Any], token: str) -> Generator[ReadStep, Any, HeldStreamBucket | None]:
    """After the claim (``claim``, under ``token``) of bucket ``seq`` of ``part`` by a reader of ``group`` (as read
    before the scan): the bucket to hold, or None (nothing to read there). If another reader finished the bucket
    since and the group committed past it, its final claim may already be deleted (claims behind the position are,
    ``apply_retention``) and the claim made a fresh one: the bucket would be read twice. The position passes a
    bucket only once its claim is final, and such claims are deleted only after that, so the position read now
    tells. A claim dropped here is behind the position: no reader looks at it, and retention deletes it."""
    current = yield from current_group(name, parts)
    if current.epoch != group.epoch or current.at(part).seq > seq:
        return None
    doc = yield ReadBucket(part, seq)
    if doc is None:  # deleted by retention since the scan: the next scan moves the group past it
        return None
    held = HeldStreamBucket.parse(doc, part, claim, group.epoch, token)
    if held.complete:  # every slot skipped (a reset into this bucket's last slot): nothing to read
        yield from finish(name, parts, held)
        return None
    return held


def finish(name: str, parts: list[Partition], held: HeldStreamBucket) -> Generator[ReadStep, Any, None]:
    """Write the claim of ``held`` (a bucket of group ``name``) as final, fenced by its token, then commit what it
    settles when it held the group back. Raises ``LeaseLost`` when the lease expired before."""
    applied = yield UpdateClaim(stream_claims.claimed_by(held.cid, held.token),
                                stream_claims.finish_claim(held.token, sorted(held.done | held.acked)),
                                stream_claims.finished_by(held.cid, held.token))
    if not applied:
        raise LeaseLost(f"the lease on bucket {held.position} of group {name!r} expired before its last ack was "
                        "written; its unacked messages will be read again")
    group = yield from current_group(name, parts)
    part = parts[held.partition]
    if group.epoch == held.epoch and group.at(part).seq == held.seq:  # this bucket held the group back
        scanned = yield from window(group, part)
        if scanned.committed > scanned.start:
            yield from commit(group, part, scanned.committed)


def commit(group: ReaderGroup, part: Partition, seq: int) -> Generator[ReadStep, Any, bool]:
    """Move the group's committed position in ``part`` forward to ``seq`` (never back: ``reader_groups.commit``)."""
    return bool((yield MoveGroup(*reader_groups.commit(group, part, seq, (yield ReadClock())))))


def uncommitted(name: str, parts: list[Partition], part: Partition, floor: int, size: int,
                holes: HoleWatch) -> Generator[ReadStep, Any, tuple[ReaderGroup, Position]]:
    """The group's range in ``part`` (retention ``floor``): (the group, the range's end), from its committed
    position up to the first sequence not stored yet, at most ``size`` buckets. A hole (an allocated sequence
    missing) ends the range; at its start, it is waited on until it lands or ``holes`` says it waited long enough,
    then marked a gap."""
    while True:
        group = yield from current_group(name, parts)
        begin = max(group.at(part).seq, floor)
        present = [part.seq_of(d) for d in (yield ReadWindow(part, begin, size))]
        end = reader_groups.advance(begin, present, present)
        last, _ = yield ReadCounter(part)
        if end > begin or end > last:  # something to read, or nothing allocated beyond
            return group, Position(end, 0, part.number) if end > begin else group.at(part)
        if holes.due([end], (yield ReadMonotonic())):
            yield MarkGap(part, end)  # or the producer's bucket landed after all
        else:
            yield WaitForHole()


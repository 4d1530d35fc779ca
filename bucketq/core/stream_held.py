"""A stream bucket a reader holds under its group's claim, sans I/O: which slots were delivered, acked and
written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.format import as_utc
from bucketq.core.stream_format import Partition, Position
from bucketq.errors import MalformedBucket


@dataclass
class HeldStreamBucket:
    """A bucket a reader holds under its group's claim: which slots were delivered, acked, and written."""

    seq: int
    partition: int
    epoch: int
    cid: Any  # the claim's _id (``stream_claims.claim_id``; a document in claims written before it was a string)
    token: str
    codec: str
    payloads: list[str | bytes | Mapping[str, Any]]
    headers: list[dict[str, Any] | None]
    created: dt.datetime
    done: set[int]  # acked (or skipped) and written to the claim
    next_slot: int = 0
    acked: set[int] = field(default_factory=set)  # acked, not yet written
    until: dt.datetime | None = None  # the lease's end as last written (server time); None: not known

    def serves_at(self, latest: dt.datetime) -> bool:
        """Whether its slots may still be handed out: ``latest`` (the latest the server's clock can read now) is
        short of the lease's end. Past it, another reader of the group may have claimed the bucket, read it and
        moved the group's committed position past it."""
        return self.until is None or latest < self.until

    @classmethod
    def parse(cls, doc: Mapping[str, Any], part: Partition, claim_doc: Mapping[str, Any], epoch: int,
              token: str) -> HeldStreamBucket:
        payloads = doc.get("p")
        if (doc.get("v") != part.version or not isinstance(payloads, list) or doc.get("n") != len(payloads)
                or not payloads or not isinstance(doc.get("enc"), str)
                or part.partitioned and doc.get("pt") != part.number):
            raise MalformedBucket(f"stream bucket {doc.get('_id')!r} does not match format version {part.version}")
        headers = doc.get("h") or [None] * len(payloads)
        held = cls(seq=part.seq_of(doc), partition=part.number, epoch=epoch, cid=claim_doc["_id"],
                   token=token, codec=doc["enc"],
                   payloads=payloads, headers=headers, created=as_utc(doc["created"]),
                   done={i for i in claim_doc.get("done", []) if isinstance(i, int)})
        lease = claim_doc.get("lease")
        if isinstance(lease, Mapping) and isinstance(lease.get("until"), dt.datetime):
            held.until = as_utc(lease["until"])
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

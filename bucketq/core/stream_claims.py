"""A reader group's claims on stream buckets, sans I/O (docs/FORMAT.md, Reader groups): one claim document per
group, epoch and bucket in ``S.claims``, under a lease, recording the slots read, final once the group read them all.

A claim's ``_id`` is a string that names its group, epoch, partition and sequence (``claim_id``), and the same are
fields of it (``claim_fields``) for the index and every query but the claim's own writes. It used to be the
document of those fields: mongo-java-server's H2 backend (the test server) orders document keys by their Java
serialization, which changes once a page of its cache is written out and read back, so that after a while it no
longer found such claims by ``_id`` (retention's delete of old claims failed, "No document with key", and claims
accumulated; a write to a claim failed, "Expected one element but got zero"). A string is found on every server."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition

NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)  # an expired lease's ``until``


def claim_fields(group: ReaderGroup, part: Partition, seq: int) -> dict[str, Any]:
    """What a claim is of, as fields: group ``g``, epoch ``e``, partition ``pt`` (partitioned streams) and
    sequence ``s``."""
    if part.partitioned:
        return {"g": group.name, "e": group.epoch, "pt": part.number, "s": seq}
    return {"g": group.name, "e": group.epoch, "s": seq}


def claim_id(group: ReaderGroup, part: Partition, seq: int) -> str:
    """The claim's ``_id``: ``"<e>:<s>:<g>"``, in a partitioned stream ``"<e>:<pt>/<s>:<g>"`` (the group's name
    last, so that a name holding ``:`` is still read one way)."""
    where = f"{part.number}/{seq}" if part.partitioned else str(seq)
    return f"{group.epoch}:{where}:{group.name}"


def claim(group: ReaderGroup, part: Partition, seq: int, now: dt.datetime, lease_s: float, token: str,
          owner: str) -> tuple[dict, dict]:
    """(filter, update) for findOneAndUpdate(upsert, return after): the group's claim on bucket ``seq`` of
    ``part``, unless it is finished or another reader's lease on it is live. Two readers upserting at once: one
    gets a duplicate key error and takes nothing. A bucket at the committed position starts with the slots
    before it done."""
    until = now + dt.timedelta(seconds=lease_s)
    committed = group.at(part)
    skipped = list(range(committed.slot)) if seq == committed.seq else []
    return ({"_id": claim_id(group, part, seq), "fin": False, "lease.until": {"$lt": now}},
            {"$set": {"lease": {"token": token, "owner": owner, "until": until}},
             "$setOnInsert": {**claim_fields(group, part, seq), "done": skipped}})


def claimed_by(cid: Any, token: str) -> dict:
    """The claim ``cid`` (its ``_id``) while the reader of ``token`` holds it: what fences its writes."""
    return {"_id": cid, "lease.token": token}


def extend_claim(until: dt.datetime, done: list[int]) -> dict:
    """Record ``done`` slots and move the lease's end to ``until`` (``NEVER``: hand the bucket back)."""
    update: dict[str, Any] = {"$set": {"lease.until": until}}
    if done:
        update["$addToSet"] = {"done": {"$each": sorted(done)}}
    return update


def finish_claim(token: str, done: list[int]) -> dict:
    """The group has read every message of the bucket: its claim is final (``fin``), whatever happens to leases."""
    return {"$set": {"fin": True, "by": token, "lease.until": NEVER}, "$addToSet": {"done": {"$each": sorted(done)}}}


def finished_by(cid: Any, token: str) -> dict:
    return {"_id": cid, "fin": True, "by": token}

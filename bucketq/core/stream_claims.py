"""A reader group's claims on stream buckets, sans I/O (docs/FORMAT.md, Reader groups): one claim document per
group, epoch and bucket in ``S.claims``, under a lease, recording the slots read, final once the group read them all."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition

NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)  # an expired lease's ``until``


def claim_id(group: ReaderGroup, part: Partition, seq: int) -> dict[str, Any]:
    if part.partitioned:
        return {"g": group.name, "e": group.epoch, "pt": part.number, "s": seq}
    return {"g": group.name, "e": group.epoch, "s": seq}


def claim(group: ReaderGroup, part: Partition, seq: int, now: dt.datetime, lease_s: float, token: str,
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

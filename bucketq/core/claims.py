"""Leases on buckets: the filters and updates of claim, extend, release, finish and requeue.

Every write a claimant makes after the claim is fenced by its token (``fenced``), so a consumer whose lease
expired, and whose bucket someone else claimed, matches nothing: its write is refused, never applied.
A bucket's ``due`` doubles as its lease expiry while it is claimed, so one index on ``due`` (after the level
``pr``, for claims by priority) serves both "ready" and "lease expired" claims.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket
from collections.abc import Mapping
from typing import Any

from bson import ObjectId

from bucketq.core.format import MAX_COUNT
from bucketq.core.priorities import BY_PRIORITY
from bucketq.core.sharding import PARTITION, in_partition


def new_token() -> str:
    return secrets.token_hex(12)


def owner_name() -> str:
    """Who holds a lease, for operators: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def claim(now: dt.datetime, lease_s: float, token: str, owner: str, *, expired_by: dt.datetime,
          partition: int | None, sort: list[tuple[str, int]] = BY_PRIORITY) -> tuple[dict, dict, list]:
    """(filter, update, sort) for findOneAndUpdate: the due bucket of ``partition`` whose lease, if any, has
    expired (a claim targets one partition: ``core.sharding``), first in ``sort`` order: of the highest level, then
    the oldest (``priorities.BY_PRIORITY``), or the oldest whatever its level (``BY_AGE``, ``priorities.Turns``).

    ``expired_by`` is the earliest the server's clock can read (``ServerClock.earliest``): another consumer's lease
    is taken over only once it ended by then, so that a reading ahead of the server's clock cannot take a bucket
    whose holder, reading by its latest, still serves it. A bucket under no lease is due by ``now``.
    ``c`` counts claims not ended by a clean release; a message's tries are ``t[slot] + c - 1``.
    """
    until = now + dt.timedelta(seconds=lease_s)
    return (
        # not "$lte": a lease without a date ``until`` (written by hand) must not make its bucket unclaimable
        {**in_partition(partition), "due": {"$lte": now},
         "$or": [{"lease": None}, {"lease.until": {"$not": {"$gt": expired_by}}}]},
        {"$set": {"due": until, "lease": {"token": token, "owner": owner, "until": until}}, "$inc": {"c": 1}},
        sort,
    )


def claim_uncounted(spec: tuple[dict, dict, list]) -> tuple[dict, dict, list]:
    """The claim of ``spec`` for a bucket whose ``c`` cannot be counted (hand-edited: not a number, so the
    ``$inc`` fails, or out of range, where a real MongoDB's ``$inc`` overflows int64): without the ``$inc``,
    for such buckets only (an array of numbers matches ``$type: number``, hence the ``$or``). The caller
    quarantines what it gets; otherwise that bucket would block every claim behind it."""
    query, update, sort = spec
    uncountable = {"$or": [{"c": {"$type": "array"}}, {"c": {"$not": {"$type": "number"}}},
                           {"c": {"$gt": MAX_COUNT}}, {"c": {"$lt": 0}}]}
    return {"$and": [query, uncountable]}, {k: v for k, v in update.items() if k != "$inc"}, sort


def ungrouped(spec: tuple[dict, dict, list]) -> tuple[dict, dict, list]:
    """The claim of ``spec`` for buckets of no ordered group (batch claims, which process in parallel)."""
    query, update, sort = spec
    return {**query, "g": {"$exists": False}}, update, sort


def fenced(ref: Mapping[str, Any], token: str) -> dict:
    """Matches the bucket whose shard key is ``ref`` (``sharding.key``) only while ``token`` still holds its
    lease."""
    return {**ref, "lease.token": token}


# A tombstone's ``due``: later than any real due time, so no claim ever matches it (BSON dates reach far
# beyond; Python's datetime ends in year 9999).
TOMBSTONE_DUE = dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)


def finish(now: dt.datetime, token: str, partition: int | None) -> dict:
    """The replacement that ends a bucket: a *tombstone* keeping only its shard key (``_id``, ``pt``), so that
    an insert of the same ``_id`` retried late (its first reply was lost) fails as a duplicate instead of storing
    the bucket again.
    ``fin.token`` says whose write finished it, so a retry of this write can tell its own success from
    someone else's. Tombstones are reaped after ``tombstone_retention`` (``reap``)."""
    return {PARTITION: partition, "v": 1, "due": TOMBSTONE_DUE, "lease": None, "fin": {"token": token, "at": now}}


def finished_by(ref: Mapping[str, Any], token: str) -> dict:
    """Matches the tombstone that ``token``'s own ``finish`` left."""
    return {**ref, "fin.token": token}


def released_by(ref: Mapping[str, Any], token: str) -> dict:
    """Matches the bucket while the last release applied to it was ``token``'s."""
    return {**ref, "released": token}


def reap(now: dt.datetime, retention_s: float) -> dict:
    """Tombstones older than ``retention_s``: no late insert retry can come after that."""
    return {"fin.at": {"$lt": now - dt.timedelta(seconds=retention_s)}}


LIVE = {"fin": {"$exists": False}}  # buckets, not tombstones: for readers that scan the collection


def extend(now: dt.datetime, lease_s: float, done: list[int] | None = None) -> dict:
    """Extend the lease, recording ``done`` slots in the same write. ``$addToSet`` makes retries harmless."""
    until = now + dt.timedelta(seconds=lease_s)
    update: dict[str, Any] = {"$set": {"due": until, "lease.until": until}}
    if done:
        update["$addToSet"] = {"done": {"$each": sorted(done)}}
    return update


def guard(now: dt.datetime, lease_s: float, done: list[int] | None = None,
          copies: list[ObjectId] | None = None) -> dict:
    """The update of the fenced write (filter ``fenced``) that a claimant runs before it writes copies of its
    messages (retry buckets, dead letters, quarantine entries): a lease extension, so that a claimant whose lease
    was lost copies nothing that someone else now holds. It records the ``_id``s of the retry buckets about to be
    inserted in ``r`` (``copies``), so that a purge that ends this bucket before they land ends them too
    (``core.operator_writes.purge_copies``); the write that marks their slots done takes them out of ``r`` again
    (``copies_landed``)."""
    update = extend(now, lease_s, done)
    if copies:
        update.setdefault("$addToSet", {})["r"] = {"$each": list(copies)}
    return update


def copies_landed(update: dict, copies: list[ObjectId]) -> dict:
    """``update`` (an extension or a release, which marks the copied slots done), also taking ``copies`` out of
    ``r``: once the slots are done, the copies are buckets like any other, which a purge finds by itself."""
    if copies:
        update["$pull"] = {"r": {"$in": list(copies)}}
    return update


def release(now: dt.datetime, token: str, done: list[int] | None = None, *, due: dt.datetime | None = None,
            count_claim: bool = False) -> dict:
    """Hand the bucket back: claimable again at ``due`` (default now).

    A clean release (``count_claim=False``) takes the claim back out of ``c``, so no tries are added to the
    messages it did not serve. A failed batch releases with ``count_claim=True``: tries + 1.
    The token is cleared in the same write, so a retried release matches nothing and changes nothing; the
    token is kept in ``released`` so that the retry can tell that its own earlier attempt got through.
    """
    update: dict[str, Any] = {"$set": {"due": due or now, "lease": None, "released": token}}
    if not count_claim:
        update["$inc"] = {"c": -1}
    if done:
        update["$addToSet"] = {"done": {"$each": sorted(done)}}
    return update

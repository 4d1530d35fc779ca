"""Leases on buckets: the filters and updates of claim, extend, release, finish and requeue.

Every write a claimant makes after the claim is fenced by its token (``fenced``), so a consumer whose lease
expired, and whose bucket someone else claimed, matches nothing: its write is refused, never applied.
A bucket's ``due`` doubles as its lease expiry while it is claimed, so a single index on ``due`` serves
both "ready" and "lease expired" claims.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket
from typing import Any

from bson import ObjectId


def new_token() -> str:
    return secrets.token_hex(12)


def owner_name() -> str:
    """Who holds a lease, for operators: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def claim(now: dt.datetime, lease_s: float, token: str, owner: str) -> tuple[dict, dict, list]:
    """(filter, update, sort) for findOneAndUpdate: the oldest due bucket whose lease, if any, has expired.

    ``c`` counts claims not ended by a clean release; a message's tries are ``t[slot] + c - 1``.
    """
    until = now + dt.timedelta(seconds=lease_s)
    return (
        {"due": {"$lte": now}},
        {"$set": {"due": until, "lease": {"token": token, "owner": owner, "until": until}}, "$inc": {"c": 1}},
        [("due", 1)],
    )


def claim_uncounted(spec: tuple[dict, dict, list]) -> tuple[dict, dict, list]:
    """The claim of ``spec`` for a bucket whose ``c`` is not a number (hand-edited), so the ``$inc`` fails:
    without the ``$inc``, for such buckets only (an array of numbers matches ``$type: number``, hence the
    ``$or``). The caller quarantines what it gets; otherwise that bucket would block every claim behind it."""
    query, update, sort = spec
    uncountable = {"$or": [{"c": {"$type": "array"}}, {"c": {"$not": {"$type": "number"}}}]}
    return {**query, **uncountable}, {k: v for k, v in update.items() if k != "$inc"}, sort


def fenced(bucket_id: ObjectId, token: str) -> dict:
    """Matches the bucket only while ``token`` still holds its lease."""
    return {"_id": bucket_id, "lease.token": token}


def extend(now: dt.datetime, lease_s: float, done: list[int] | None = None) -> dict:
    """Extend the lease, recording ``done`` slots in the same write. ``$addToSet`` makes retries harmless."""
    until = now + dt.timedelta(seconds=lease_s)
    update: dict[str, Any] = {"$set": {"due": until, "lease.until": until}}
    if done:
        update["$addToSet"] = {"done": {"$each": sorted(done)}}
    return update


def release(now: dt.datetime, done: list[int] | None = None, *, due: dt.datetime | None = None,
            count_claim: bool = False) -> dict:
    """Hand the bucket back: claimable again at ``due`` (default now).

    A clean release (``count_claim=False``) takes the claim back out of ``c``, so no tries are added to the
    messages it did not serve. A failed batch releases with ``count_claim=True``: tries + 1.
    The token is cleared in the same write, so a retried release matches nothing and changes nothing.
    """
    update: dict[str, Any] = {"$set": {"due": due or now, "lease": None}}
    if not count_claim:
        update["$inc"] = {"c": -1}
    if done:
        update["$addToSet"] = {"done": {"$each": sorted(done)}}
    return update

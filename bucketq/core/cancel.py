"""Cancelling one message, sans-I/O: the cancel request on its bucket, the record of a cancelled message, and what
``Queue.cancel`` reports.

A cancellation runs in three writes, each safe to repeat and each leaving the next to whoever comes first:

1. the *request*: ``$addToSet: {x: slots}`` on the bucket (any bucket not yet done with those slots, claimed or
   not), as a findAndModify that returns the bucket as the request left it. From then on every consumer that
   claims the bucket sees the request in its claim's reply, and a consumer already holding it reads it after a
   lease extension, at most every half lease: either ends the message as cancelled instead of serving it;
2. when the returned bucket is under no live lease: the *record*, a dead letter with ``cancelled: true`` and
   ``error: "cancelled"`` (``_id`` is the message id, so a repeat stores it once);
3. the *removal* (``operator_writes.removal``): the slot marked done, applied only while the bucket is still
   unclaimed (or under the expired claim that was read).

The record is written before the slot is marked done, so a crash in between leaves a record of a message still
pending: the request on the bucket makes its next claimant cancel it (a repeat of the record, stored once),
and a repeated ``cancel`` finishes the job. A message is never marked done without its record. A bucket under a
live lease gets the request only: its holder decides, and records the cancellation when it ends the message so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, TypeGuard

from bucketq.core.claims import LIVE
from bucketq.core.format import StoredBucket, dead_letter
from bucketq.core.sharding import PARTITION

CANCELLED = "cancelled"  # the message will not be delivered (again): its record is in the dead letters
REQUESTED = "requested"  # a consumer holds the message: it sees the request and ends the message as cancelled
NOT_FOUND = "not_found"  # no pending message has this id: unknown, finished, or not yet written
REASON = "cancelled"  # the ``error`` of a cancelled message's record
CANCELLED_RECORDS = {"cancelled": True}  # the records among the dead letters (counted by ``Queue.stats``: a scan)


def request(doc: Mapping[str, Any], slots: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) of the cancel request for ``slots`` of the bucket ``doc``: applied to the live bucket while
    none of those slots is done, whoever holds it (a findAndModify, returning the bucket after the update)."""
    ref = {PARTITION: doc.get(PARTITION), "_id": doc["_id"]}
    return {**ref, **LIVE, "done": {"$nin": slots}}, {"$addToSet": {"x": {"$each": sorted(slots)}}}


def still_pending(after: Mapping[str, Any] | None, slots: list[int]) -> TypeGuard[Mapping[str, Any]]:
    """Whether the bucket a request returned (``after``) is live with none of ``slots`` done, as its filter asked. A
    server whose findAndModify is not atomic under concurrent writes (mongo-java-server) can return the tombstone
    that a finish put in its place meanwhile: then the bucket is read again."""
    if after is None or "fin" in after:
        return False
    done = after.get("done")
    return isinstance(done, list) and not set(slots) & set(done)


def records(bucket: StoredBucket, slots: list[int], now: dt.datetime) -> list[dict[str, Any]]:
    """The dead-letter records of ``slots`` cancelled while pending in ``bucket`` (as read: valid, since
    ``operator_writes.pending_slots`` found them). ``tries``: the deliveries made, the claims counted in ``c``."""
    return [dead_letter(bucket, s, tries=bucket.base_tries[s] + bucket.claims, error=REASON, at=now, cancelled=True)
            for s in slots]


def record_filter(message_id: str) -> dict[str, Any]:
    """A message's cancellation record in ``Q.dead`` (by ``_id``; a dead letter of a failure is not one)."""
    return {"_id": message_id, "cancelled": True}


def reported(outcomes: list[str]) -> str:
    """What ``Queue.cancel`` reports for the outcomes in each bucket that held the message (a retry copy can sit
    beside its original after a crash): requested while any holder has yet to act on it."""
    return REQUESTED if REQUESTED in outcomes else CANCELLED

"""Operator controls, sans-I/O: the pause document of ``Q.control``, and the filters and updates that remove
one pending message or purge a whole queue without racing the consumers that may hold its buckets.

A removal marks the message's slot done like an ack would, with a write that applies only while the bucket
is in the state the operator's read found it in: unclaimed (``lease: null``), or claimed under a lease that
has expired (conditioned on that claim's token; the lease is cleared, so the late claimant's own writes are
refused from then on and it cannot write a retry copy of the removed message). A bucket under a live lease is
left alone: its consumer may be handling the message right now.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from bson import ObjectId

from bucketq.core.claims import LIVE, TOMBSTONE_DUE
from bucketq.core.format import MAX_BUCKET_SIZE, parse_bucket
from bucketq.core.sharding import PARTITION
from bucketq.errors import InvalidOption, MalformedBucket

# -- pause ---------------------------------------------------------------------------------------------------

PAUSE_ID = "pause"  # the ``_id`` of the pause document in ``Q.control``
PAUSE = {"_id": PAUSE_ID}


def initial_pause() -> dict[str, Any]:
    """The update that creates the pause document, not paused, unless it exists (upsert at queue setup)."""
    return {"$setOnInsert": {"paused": False}}


def set_pause(paused: bool, *, now: dt.datetime, by: str) -> dict[str, Any]:
    """Pause or resume the queue; ``at`` and ``by`` (host:pid) tell operators who did it and when."""
    return {"$set": {"paused": paused, "at": now, "by": by}}


def is_paused(doc: Mapping[str, Any] | None) -> bool:
    """Only ``paused: true`` pauses: a missing document or field (a queue that was never paused) does not."""
    return doc is not None and doc.get("paused") is True


# -- removing one message ---------------------------------------------------------------------------------------

_PRODUCER_ID = re.compile(r"([0-9a-f]{24}):(\d{1,5})")


def check_message_id(message_id: object) -> str:
    if not isinstance(message_id, str) or not message_id:
        raise InvalidOption(f"message_id must be a non-empty string, got {message_id!r}")
    try:
        message_id.encode()
    except UnicodeEncodeError:
        raise InvalidOption(f"message_id is not valid Unicode text: {message_id!r}") from None
    return message_id


def producer_bucket(message_id: str) -> ObjectId | None:
    """The bucket a message id names when it has the form bucketq gives every message
    (``<bucket _id as 24 hex digits>:<slot>``, docs/FORMAT.md), else None."""
    match = _PRODUCER_ID.fullmatch(message_id)
    return ObjectId(match.group(1)) if match and int(match.group(2)) < MAX_BUCKET_SIZE else None


def holders(message_id: str) -> dict[str, Any]:
    """Unfinished buckets that may hold ``message_id``: the bucket its id names (``<bucket>:<slot>``, a message
    as its producer stored it) and every bucket with a copy of it (``o``: retries, requeued entries; a crash
    between a copy's insert and its original's mark can leave two). ``o`` has no index: this scans the
    queue's buckets."""
    where: list[dict[str, Any]] = [{"o": message_id}]
    if (bucket := producer_bucket(message_id)) is not None:
        where.insert(0, {"_id": bucket})
    return {"$or": where, **LIVE}


def pending_slots(doc: Mapping[str, Any], message_id: str) -> list[int]:
    """Slots of the bucket ``doc`` that hold ``message_id`` and are not done. A malformed document holds none:
    consumers quarantine it whole."""
    try:
        bucket = parse_bucket(doc)
    except MalformedBucket:
        return []
    return [s for s in range(bucket.size) if s not in bucket.done and bucket.message_id(s) == message_id]


def live_lease(doc: Mapping[str, Any], now: dt.datetime) -> Mapping[str, Any] | None:
    """The lease of a bucket that a consumer holds at ``now`` (a claimed bucket's ``due`` is its lease expiry),
    else None."""
    lease = doc.get("lease")
    if lease is None:
        return None
    due = doc.get("due")
    return lease if not isinstance(due, dt.datetime) or due > now else None


def removal(doc: Mapping[str, Any], slots: list[int], now: dt.datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) marking ``slots`` done in a bucket no consumer holds: applied only if the bucket is still
    unclaimed, or still under the expired claim that was read (which the update clears)."""
    update: dict[str, Any] = {"$addToSet": {"done": {"$each": sorted(slots)}}}
    lease = doc.get("lease")
    ref = {PARTITION: doc.get(PARTITION), "_id": doc["_id"]}
    if lease is None:
        return {**ref, "lease": None}, update
    update["$set"] = {"lease": None}
    return {**ref, "lease.token": lease.get("token"), "due": {"$lte": now}}, update


# -- purging ----------------------------------------------------------------------------------------------------

def purge_mark(now: dt.datetime, token: str) -> dict[str, Any]:
    """The update (for every unfinished bucket at once) that ends buckets as a purge: never claimable again,
    no lease (so a consumer holding one has its writes refused), marked ``fin`` with the purge's token. The
    documents are then replaced by tombstones (``claims.finish``) once their messages are counted: kept under
    their ``_id``, so that a producer's late insert retry cannot store a purged bucket again."""
    return {"$set": {"due": TOMBSTONE_DUE, "lease": None, "fin": {"token": token, "at": now}}}


# what a purge reads of a marked bucket: its counts, its retry copies, its token and shard key, its unique keys
PURGED_FIELDS = {"n": 1, "done": 1, "r": 1, "fin.token": 1, PARTITION: 1, "k": 1, "o": 1, "u": 1}


def purged_by(*tokens: str) -> dict[str, Any]:
    """Buckets a purge marked with one of ``tokens`` and has not yet replaced by tombstones."""
    return {"fin.token": {"$in": list(tokens)}, "n": {"$exists": True}}  # a tombstone has no n


def copies_on_their_way(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The retry buckets that a claimant of the purged bucket ``doc`` may still be inserting (``r``, recorded by
    its fenced write before the insert: ``claims.guard``). A purge ends them too: it stores their tombstones
    first, so that an insert landing later stores nothing, and ends those that landed since its mark. Returns
    their shard keys: a copy is in the partition of its bucket."""
    copies = doc.get("r")
    if not isinstance(copies, list):
        return []
    return [{PARTITION: doc.get(PARTITION), "_id": c} for c in copies if isinstance(c, ObjectId)]


def unfinished_messages(doc: Mapping[str, Any]) -> int:
    """``n - |done|`` of a bucket; 0 for a document whose ``n`` or ``done`` is off-format."""
    n, done = doc.get("n"), doc.get("done")
    if not isinstance(n, int) or isinstance(n, bool) or not isinstance(done, list):
        return 0
    return max(0, n - len(set(done)))

"""Change streams (async only: the synchronous shells poll): what wakes idle consumers, the outbox relay and
``bucketq top``'s in/out rates. Each watch asks the server for as little as it needs."""

from __future__ import annotations

from typing import Any

from bucketq.core import housekeeping

STREAM_AWAIT_MS = 1000  # how long a server holds an empty change-stream getMore
# A wake-up needs to know that a change happened and when its bucket is due, not what it stored. Without this
# projection every event carries its whole document (a bucket: up to 16 MiB): a batch of them overflows one
# reply (the test server's 48 MB), and real MongoDB refuses an event over 16 MiB.
WITHOUT_BODIES = {"$project": {"operationType": 1}}
# With its partition (``pt``), where the consumer claims first. An insert carries it; an update does not.
DUE_ONLY = {"$project": {"operationType": 1, "fullDocument.due": 1, "updateDescription.updatedFields.due": 1,
                         "fullDocument.pt": 1}}
# The changes that can make a bucket claimable: an insert (a push, a retry copy, a requeue), a release (it clears
# the lease: a drain, a nack or a group's bucket set to wait) and a group's hand-off (it removes ``w``). Claims,
# lease extensions and finishes match none. mongo-java-server reports an update's set and unset fields under
# ``fullDocument`` instead of ``updateDescription``: the last two clauses are its spelling of the two before.
WAKING_CHANGES = {"$match": {"$or": [
    {"operationType": "insert"},
    {"operationType": "update", "updateDescription.updatedFields.lease": {"$type": "null"}},
    {"operationType": "update", "updateDescription.removedFields": "w"},
    {"operationType": "update", "updateDescription": {"$exists": False}, "fullDocument.lease": {"$type": "null"}},
    {"operationType": "update", "updateDescription": {"$exists": False}, "fullDocument.w": ""},
]}}
WATCH_CHANGES = [WAKING_CHANGES, DUE_ONLY]
# A queue's control collection: a pause or resume (an upsert of the pause document), not the housekeeping lease's
# renewals (told apart by their field: the test server's update events carry no document key), which would
# send each consumer to read the pause document once a round. mongo-java-server reports an update's fields under
# ``fullDocument``, as it does an insert's.
WATCH_CONTROL = [{"$match": {"operationType": {"$in": ["insert", "update", "replace"]},
                             f"fullDocument.{housekeeping.UNTIL}": {"$exists": False},
                             f"updateDescription.updatedFields.{housekeeping.UNTIL}": {"$exists": False}}},
                 WITHOUT_BODIES]
# A stream's buckets collection: a bucket (or a gap marker) lands, with its partition (a stream's ``pt``).
WATCH_STREAM_INSERTS = [{"$match": {"operationType": "insert"}},
                        {"$project": {"operationType": 1, "fullDocument.pt": 1}}]


async def watch_events(collection: Any, field: str, start: Any) -> Any:
    """The changes that leave outbox events in a document of ``collection`` (an insert, update or replace whose
    document, looked up after it, holds some in ``field``), from ``start`` (a cluster time) on. Changes made by
    the relay's own pulls leave none and wake nothing."""
    match = {"operationType": {"$in": ["insert", "update", "replace"]}, f"fullDocument.{field}.0": {"$exists": True}}
    return await collection.watch([{"$match": match}, WITHOUT_BODIES], full_document="updateLookup",
                                  start_at_operation_time=start, max_await_time_ms=STREAM_AWAIT_MS)


async def watch_bucket_sizes(collection: Any, start: Any) -> Any:
    """The inserts of buckets into ``collection`` from ``start`` on, each with its message count only
    (``fullDocument.n``)."""
    return await collection.watch([{"$match": {"operationType": "insert", "fullDocument.n": {"$exists": True}}},
                                   {"$project": {"fullDocument.n": 1}}],
                                  start_at_operation_time=start, max_await_time_ms=50)

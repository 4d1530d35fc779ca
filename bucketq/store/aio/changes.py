"""Change streams (async only: the synchronous shells poll): what wakes idle consumers, the outbox relay and
``bucketq top``'s in/out rates. Each watch asks the server for as little as it needs."""

from __future__ import annotations

from typing import Any

# A wake-up needs to know that a change happened, not what it stored. Without this stage every event carries
# its whole document (a bucket: up to 16 MiB): a batch of them overflows one reply (the test server's 48 MB),
# and real MongoDB refuses an event over 16 MiB.
WITHOUT_BODIES = {"$project": {"operationType": 1}}
WATCH_INSERTS = [{"$match": {"operationType": "insert"}}, WITHOUT_BODIES]


async def watch_events(collection: Any, field: str, start: Any) -> Any:
    """The changes that leave outbox events in a document of ``collection`` (an insert, update or replace whose
    document, looked up after it, holds some in ``field``), from ``start`` (a cluster time) on. Changes made by
    the relay's own pulls leave none and wake nothing."""
    match = {"operationType": {"$in": ["insert", "update", "replace"]}, f"fullDocument.{field}.0": {"$exists": True}}
    return await collection.watch([{"$match": match}, WITHOUT_BODIES], full_document="updateLookup",
                                  start_at_operation_time=start, max_await_time_ms=1000)


async def watch_bucket_sizes(collection: Any, start: Any) -> Any:
    """The inserts of buckets into ``collection`` from ``start`` on, each with its message count only
    (``fullDocument.n``)."""
    return await collection.watch([{"$match": {"operationType": "insert", "fullDocument.n": {"$exists": True}}},
                                   {"$project": {"fullDocument.n": 1}}],
                                  start_at_operation_time=start, max_await_time_ms=50)

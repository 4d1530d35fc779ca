"""``Queue.cancel``'s conversation with the store: the request, the record and the removal of
``core.cancel``, in each bucket that holds the message, read again when a consumer's write got in between."""

from __future__ import annotations

from typing import Any

from pymongo.errors import PyMongoError

from bucketq.core.cancel import (
    CANCELLED,
    NOT_FOUND,
    REQUESTED,
    records,
    reported,
    still_pending,
)
from bucketq.core.format import parse_bucket
from bucketq.core.held import SlotState
from bucketq.core.operator_writes import live_lease, pending_slots
from bucketq.core.retry import is_transient
from bucketq.errors import MessageHeld
from bucketq.shell.clock import ServerClock
from bucketq.shell.unique import release_keys
from bucketq.store.aio.queue_store import AsyncQueueStore

ATTEMPTS = 5  # reads of a message's buckets when consumers keep claiming or finishing them meanwhile


async def cancel(store: AsyncQueueStore, clock: ServerClock, message_id: str) -> str:
    """``CANCELLED``, ``REQUESTED`` or ``NOT_FOUND`` (``core.cancel``) for the message ``message_id``."""
    for _ in range(ATTEMPTS):
        found = [(doc, slots) for doc in await store.holders(message_id)
                 if (slots := pending_slots(doc, message_id))]
        if not found:  # none pending: cancelled already (a repeat, or a lost reply), or nothing to cancel
            return CANCELLED if await store.cancel_recorded(message_id) else NOT_FOUND
        outcomes = [await _cancel_in(store, clock, doc, slots) for doc, slots in found]
        if None not in outcomes:
            return reported([o for o in outcomes if o is not None])
    raise MessageHeld(f"message {message_id!r} kept changing hands while it was being cancelled; try again")


async def _cancel_in(store: AsyncQueueStore, clock: ServerClock, doc: dict[str, Any], slots: list[int]) -> str | None:
    """Cancel ``slots`` of the bucket ``doc``: ``REQUESTED`` when a consumer holds it, ``CANCELLED`` once marked
    done here, None when the bucket changed meanwhile (finished, claimed, or a lost reply): read it again."""
    after = await store.request_cancel(doc, slots)
    if not still_pending(after, slots):
        return None
    # A lease is taken back only once it ended by the earliest reading of the clock, as a claim would.
    now = clock.earliest()
    if live_lease(after, now) is not None:
        return REQUESTED
    bucket = parse_bucket(after)
    await store.add_dead_letters(records(bucket, slots, now))
    try:
        applied = await store.remove_slots(after, slots, now)
    except PyMongoError as exc:
        if not is_transient(exc):
            raise
        return None  # applied or not, the next read tells
    if applied and bucket.unique:  # a cancelled unique job is finished: its key is free again
        await release_keys(store, bucket, dict.fromkeys(slots, SlotState.DEAD))
    return CANCELLED if applied else None

"""``push(payload, session=s)``: a message written in the application's own transaction (replica sets), unbuffered,
as a bucket of its own. It exists if and only if the transaction commits. (The other way to enqueue with the
application's own write, with no transaction, is the embedded outbox: ``bucketq.outbox``.)"""

from __future__ import annotations

import datetime as dt
from typing import Any

from bson import ObjectId
from pymongo.asynchronous.client_session import AsyncClientSession

from bucketq.core.format import AnySlot, bucket_document, message_id
from bucketq.errors import InvalidOption
from bucketq.motor_adapter import is_motor
from bucketq.store.aio.queue_store import AsyncQueueStore


def single_bucket(bucket_id: ObjectId, slot: AnySlot, *, codec: str, now: dt.datetime,
                  due: dt.datetime | None, priority: int = 0) -> dict[str, Any]:
    """A bucket holding one message, due at ``due`` (None: now): a transaction's push, an outbox event."""
    return bucket_document(bucket_id, [slot], codec=codec, created=now, due=due or now, priority=priority)


def check_session(session: Any, client: Any) -> None:
    """Refuse, with ``InvalidOption``, a ``session`` that ``push(session=...)`` cannot write in: not a session of
    ``client`` (the queue's), ended, or with no transaction running."""
    if not isinstance(session, AsyncClientSession) and not is_motor(session):
        raise InvalidOption("session must be a session of the queue's client, in a transaction "
                            f"(session = client.start_session()), got {type(session).__name__}")
    if session.client is not client:
        raise InvalidOption("session belongs to another client than the queue's: build the Queue on the client "
                            "that runs the transaction (bucketq.Queue(client, name=...))")
    if session.has_ended:
        raise InvalidOption("session has ended")
    if not session.in_transaction:
        raise InvalidOption("push(session=...) writes in the session's transaction, and none is running: push "
                            "inside `async with await session.start_transaction():` or session.with_transaction()")


async def push_in_transaction(store: AsyncQueueStore, session: Any, slot: AnySlot, *, codec: str, now: dt.datetime,
                              due: dt.datetime | None, priority: int = 0) -> str:
    """Write one message, already checked and encoded as a push's is (``slot``), in ``session``'s transaction,
    once: its errors are the caller's (a retry belongs to the whole transaction). Returns its id."""
    doc = single_bucket(ObjectId(), slot, codec=codec, now=now, due=due, priority=priority)
    await store.insert_buckets([doc], session=session)
    return message_id(doc["_id"], 0)

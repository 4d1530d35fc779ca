"""The embedded outbox's relay pass, sans-I/O (``bucketq.outbox`` runs it): the events of the documents read are
checked against the event format, each becomes a bucket of its own whose ``_id`` is the same whoever relays it
(``event_bucket_id``), a document's undelayed events get due times in their order (``plan``), and the source
writes that end the pass pull them or set them aside (``removals``)."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import bson
from bson import ObjectId
from pymongo import UpdateOne

from bucketq.core.backoff import check_delay
from bucketq.core.format import DOCUMENT_CODEC, MAX_BUCKET_BYTES, Slot, bucket_document, slot_bytes, stored_payload_ok

REJECTED_SUFFIX = "_rejected"
# A document's events due at once get due times this far apart, in their order: BSON dates count milliseconds.
ORDER_STEP = dt.timedelta(milliseconds=1)


def event_bucket_id(namespace: str, doc_id: Any, event_id: ObjectId) -> ObjectId:
    """The ``_id`` of the bucket that carries event ``event_id`` of document ``doc_id`` of collection
    ``namespace`` ("db.collection"): the same whoever relays it. Its first four bytes are the event id's
    (its creation second), the other eight a hash of the three."""
    digest = hashlib.blake2b(bson.encode({"ns": namespace, "doc": doc_id, "event": event_id}), digest_size=8)
    return ObjectId(event_id.binary[:4] + digest.digest())


class Event(NamedTuple):
    """A valid ``_outbox`` element: its id, the codec of its payload, the message, and when it is due."""

    id: ObjectId
    codec: str
    slot: Slot
    delay: float | None
    at: dt.datetime | None


def parse_event(value: Any) -> Event:
    """An ``_outbox`` element checked against the event format; ``ValueError`` says what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"an event must be a document, got {type(value).__name__}")
    event_id, codec, payload = value.get("id"), value.get("enc"), value.get("p")
    headers, key, delay, at = value.get("h"), value.get("k"), value.get("delay"), value.get("at")
    if not isinstance(event_id, ObjectId):
        raise ValueError("id must be an ObjectId")
    if not isinstance(codec, str) or not codec:
        raise ValueError("enc must be a codec name")
    if not stored_payload_ok(payload, codec):
        raise ValueError(f"p must be a {'document' if codec == DOCUMENT_CODEC else 'string or binary'} "
                         f"(the payload encoded by codec {codec!r})")
    if headers is not None and not isinstance(headers, Mapping):
        raise ValueError("h must be a document")
    if key is not None and not isinstance(key, str):
        raise ValueError("k must be a string")
    if delay is not None:
        check_delay(delay)  # InvalidOption is a ValueError
    if at is not None and not isinstance(at, dt.datetime):
        raise ValueError(f"at must be a date up to year 9999, got {type(at).__name__}")
    if delay is not None and at is not None:
        raise ValueError("give delay or at, not both")
    size = slot_bytes(payload, len(bson.encode(headers)) if headers else 0, key)
    if size > MAX_BUCKET_BYTES:
        raise ValueError(f"the event takes {size} bytes; a bucket holds at most {MAX_BUCKET_BYTES}")
    return Event(event_id, codec, Slot(payload, headers or None, key), delay, at)


class SetAside(NamedTuple):
    """An element of a document's events set aside: ``whole`` when the field itself is no array."""

    doc_id: Any
    value: Any
    reason: str
    whole: bool = False


@dataclass
class RelayPass:
    """One relay pass: the buckets to insert, then per document the event ids to pull and what to set aside."""

    next_due: dt.datetime  # where the next pass's undelayed events start (``plan``)
    buckets: list[dict[str, Any]] = field(default_factory=list)
    pulls: list[tuple[Any, list[ObjectId]]] = field(default_factory=list)
    set_aside: list[SetAside] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(len(ids) for _, ids in self.pulls) + len(self.set_aside)


def plan(docs: Sequence[Mapping[str, Any]], *, field: str, namespace: str, now: dt.datetime,
         after: dt.datetime | None = None) -> RelayPass:
    """The pass over ``docs`` (each with ``_id`` and ``field``). A document's undelayed events are due one
    ``ORDER_STEP`` apart in their order, from ``now`` or, when later, from ``after`` (the previous pass's
    ``next_due``): a document's events reach consumers in the order it holds them, across passes too."""
    start = max(now, after) if after is not None else now
    relay_pass = RelayPass(next_due=start)
    for doc in docs:
        events = doc.get(field)
        if not isinstance(events, list):
            relay_pass.set_aside.append(SetAside(doc["_id"], events, f"{field} must be an array of events", whole=True))
            continue
        due = start
        ids: dict[ObjectId, None] = {}  # a dict: the ids in their order
        for value in events:
            try:
                parsed = parse_event(value)
            except ValueError as exc:
                relay_pass.set_aside.append(SetAside(doc["_id"], value, str(exc)))
                continue
            if parsed.id in ids:
                continue  # the same event twice: one bucket, and the pull by id takes both
            ids[parsed.id] = None
            if parsed.at is not None:
                when = parsed.at
            elif parsed.delay:
                when = now + dt.timedelta(seconds=parsed.delay)
            else:
                when, due = due, due + ORDER_STEP
            relay_pass.buckets.append(bucket_document(event_bucket_id(namespace, doc["_id"], parsed.id), [parsed.slot],
                                                 codec=parsed.codec, created=now, due=when))
        if ids:
            relay_pass.pulls.append((doc["_id"], list(ids)))
        relay_pass.next_due = max(relay_pass.next_due, due)
    return relay_pass


def removals(relay_pass: RelayPass, *, field: str, now: dt.datetime) -> list[UpdateOne]:
    """The source writes that end a pass, all idempotent: pull the relayed events by id; move each element set
    aside into ``<field>_rejected`` as ``{event, reason, at}``, only while it is still there (two relays record
    it once). Elements are matched whole (``$in``): a document given to ``$pull`` as such would be a query, and
    could match good events too."""
    ops = [UpdateOne({"_id": doc_id}, {"$pull": {field: {"id": {"$in": ids}}}}) for doc_id, ids in relay_pass.pulls]
    for aside in relay_pass.set_aside:
        remove = {"$unset": {field: ""}} if aside.whole else {"$pull": {field: {"$in": [aside.value]}}}
        entry = {"event": aside.value, "reason": aside.reason, "at": now}
        ops.append(UpdateOne({"_id": aside.doc_id, field: {"$in": [aside.value]}},
                             {**remove, "$push": {field + REJECTED_SUFFIX: entry}}))
    return ops

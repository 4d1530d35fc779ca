"""Unique jobs (``push(key=..., unique_for=...)``): the key documents of ``Q.unique`` and what a producer makes of
the one it finds (docs/FORMAT.md, Unique jobs).

A key is *held* by one message: ``{_id: key, m: <message id>, until: <date>}``. The producer inserts the key
documents of a bucket's unique messages before the bucket itself; a message whose key another live message holds is
*merged* into that one: its slot is written already done, and its push resolves to the holder's id. The consumer
deletes ``{_id: key, m: id}`` once the message is finished (acked, dead-lettered, quarantined), so the key is free
again; ``until`` bounds how long a message that never finishes (its producer crashed between the two inserts, its
consumer crashed before the delete) holds it: after that, the next push takes the key over.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bucketq.core.format import StoredBucket, message_id
from bucketq.core.held import SlotState

# ``verdict`` of a key document found after a duplicate key on insert, besides a live holder's message id:
OWN = "own"  # this message holds it: an earlier attempt whose reply was lost got through
GONE = "gone"  # deleted in between (its holder finished): insert again
EXPIRED = "expired"  # its holder's ``until`` passed: take it over (``takeover``)
# A message in these states is finished: its key is free again. A nacked one (RETRY) holds it on, under its id.
FINISHED = frozenset({SlotState.ACKED, SlotState.DEAD, SlotState.QUARANTINED})


@dataclass(frozen=True)
class Hold:
    """The key one unique message of a bucket asks to hold: slot ``slot`` of ``docs[bucket]``."""

    bucket: int
    slot: int
    key: str
    message: str  # the message's id
    until: dt.datetime

    @property
    def document(self) -> dict[str, Any]:
        return {"_id": self.key, "m": self.message, "until": self.until}


def holds(docs: list[dict[str, Any]]) -> Iterator[Hold]:
    """The keys the unique messages (``u``) of new buckets ask to hold, in bucket and slot order."""
    for index, doc in enumerate(docs):
        for slot, until in enumerate(doc.get("u") or ()):
            if until is not None:
                yield Hold(index, slot, doc["k"][slot], message_id(doc["_id"], slot), until)


def verdict(hold: Hold, found: Mapping[str, Any] | None, now: dt.datetime) -> str:
    """What the key document ``found`` after ``hold``'s insert met a duplicate key says: ``OWN``, ``GONE``,
    ``EXPIRED``, or the id of the live message that holds the key."""
    if found is None:
        return GONE
    if found.get("m") == hold.message:
        return OWN
    until = found.get("until")
    if isinstance(until, dt.datetime) and until < now:
        return EXPIRED
    return str(found.get("m"))


def takeover(hold: Hold, now: dt.datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    """The conditional update that moves an expired key to ``hold``'s message: it matches nothing when another
    producer took the key over first, or its holder was given a new ``until`` meanwhile."""
    return {"_id": hold.key, "until": {"$lt": now}}, {"$set": {"m": hold.message, "until": hold.until}}


def merge(docs: list[dict[str, Any]], merged: Mapping[Hold, str]) -> list[dict[str, Any]]:
    """Mark the merged slots of ``docs`` done (in place); return the buckets left to insert: those with a slot
    not merged. Slots keep their places, so the other messages' ids (``<bucket>:<slot>``) do not change."""
    for hold in merged:
        doc = docs[hold.bucket]
        doc["done"] = sorted({*doc["done"], hold.slot})
    return [doc for doc in docs if len(doc["done"]) < doc["n"]]


def held_by(doc: Mapping[str, Any]) -> dict[str, str]:
    """The keys the unfinished unique messages of a stored bucket hold, ``{key: message id}`` (a purge frees them)."""
    unique, keys, origins, done = doc.get("u") or (), doc.get("k") or (), doc.get("o") or (), set(doc["done"])
    return {keys[slot]: (origins[slot] if origins and origins[slot] else message_id(doc["_id"], slot))
            for slot, until in enumerate(unique) if until is not None and slot not in done and keys[slot]}


def freed(bucket: StoredBucket, slots: Mapping[int, SlotState]) -> dict[str, str]:
    """The keys that the unique messages among ``slots`` of ``bucket`` (a flush's, just applied) hold, if they are
    finished (``FINISHED``): ``{key: message id}``, to delete (``finished``)."""
    unique = bucket.unique or ()
    return {key: bucket.message_id(slot) for slot, state in slots.items()
            if state in FINISHED and unique[slot] is not None and (key := bucket.keys[slot]) is not None}


def finished(slots: Mapping[str, str]) -> dict[str, Any]:
    """The key documents still held by finished messages (``{key: message id}``), to delete: each message holds at
    most its own key, so matching the keys and the ids as sets matches no one else's."""
    return {"_id": {"$in": list(slots)}, "m": {"$in": list(slots.values())}}

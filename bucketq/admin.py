"""Operator actions on dead letters and quarantine: list, requeue, purge; and retention purges."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from bson import ObjectId

from bucketq.core.format import Slot, as_utc, bucket_document
from bucketq.errors import InvalidOption
from bucketq.options import check_delay

REQUEUE_CHUNK = 1000


def entry_filter(*, older_than_s: float | None = None, error_contains: str | None = None,
                 ids: list[Any] | None = None, now: dt.datetime, error_field: str) -> dict[str, Any]:
    """Filter dead letters (``error_field="error"``) or quarantine entries (``"reason"``). Bad arguments raise
    ``InvalidOption`` here, before any query is sent."""
    query: dict[str, Any] = {}
    if older_than_s is not None:
        try:
            seconds = check_delay(older_than_s)
        except InvalidOption as exc:
            raise InvalidOption(f"older_than: {exc}") from None
        query["at"] = {"$lt": now - dt.timedelta(seconds=seconds)}
    if error_contains is not None:
        if not isinstance(error_contains, str):
            raise InvalidOption(f"error_contains must be a str, got {type(error_contains).__name__}")
        try:
            error_contains.encode("utf-8")  # what the query is sent as
        except UnicodeEncodeError:
            raise InvalidOption(f"error_contains is not valid Unicode text: {error_contains!r}") from None
    if error_contains:
        query[error_field] = {"$regex": re.escape(error_contains), "$options": "i"}
    if ids is not None:
        if not isinstance(ids, (list, tuple)):  # a str is one id, not a list of them
            raise InvalidOption(f"ids must be a list of entry ids, got {type(ids).__name__}")
        query["_id"] = {"$in": list(ids)}
    return query


def requeued_bucket(entries: list[dict[str, Any]], *, now: dt.datetime) -> dict[str, Any]:
    """One fresh bucket holding the messages of dead-letter or message-quarantine entries, tries reset,
    ids kept. All entries must share a codec (the caller groups them)."""
    slots = [Slot(payload=e["p"], headers=e.get("h"), key=e.get("k"), tries=0, origin=str(e["_id"]),
                  enqueued_at=as_utc(e["enqueued_at"]) if e.get("enqueued_at") else None) for e in entries]
    return bucket_document(ObjectId(), slots, codec=entries[0]["enc"], created=now, due=now)


def requeued_original(entry: dict[str, Any], *, now: dt.datetime) -> dict[str, Any]:
    """A quarantined whole bucket put back as it was, claimable now and unclaimed."""
    doc = dict(entry["doc"])
    doc.update(due=now, lease=None, c=0)
    return doc

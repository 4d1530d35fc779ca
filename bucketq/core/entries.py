"""Operator actions on dead letters and quarantine: list, requeue, purge; and retention purges."""

from __future__ import annotations

import datetime as dt
import enum
import re
from dataclasses import dataclass
from typing import Any

from bson import ObjectId

from bucketq.core.backoff import check_delay
from bucketq.core.format import Slot, as_utc, bucket_documents, parse_bucket
from bucketq.core.priorities import stored_priority
from bucketq.errors import InvalidOption, MalformedBucket

REQUEUE_CHUNK = 1000


class EntryKind(enum.Enum):
    """The entries an operator lists, requeues and purges: a queue's dead letters or its quarantine."""

    DEAD = "dead"
    QUARANTINE = "quarantine"

    @property
    def reason_field(self) -> str:
        """The field that says why an entry is there (what ``error_contains`` searches)."""
        return "error" if self is EntryKind.DEAD else "reason"


@dataclass(frozen=True)
class Selection:
    """Which entries an operator action takes: by age (``older_than_s``, by ``now``), by text in their reason,
    by ids; None selects by nothing. ``entry_filter`` checks the values when the store asks for the filter."""

    now: dt.datetime
    older_than_s: float | None = None
    error_contains: str | None = None
    ids: list[Any] | None = None

    def filter(self, kind: EntryKind) -> dict[str, Any]:
        """The filter of the selected entries of ``kind`` (``entry_filter``)."""
        return entry_filter(older_than_s=self.older_than_s, error_contains=self.error_contains, ids=self.ids,
                            now=self.now, error_field=kind.reason_field)


def entry_filter(*, older_than_s: float | None = None, error_contains: str | None = None,
                 ids: list[Any] | None = None, now: dt.datetime, error_field: str) -> dict[str, Any]:
    """Filter dead letters (``error_field="error"``) or quarantine entries (``"reason"``). ``now`` is the latest
    reading of the server's clock (``ServerClock.latest``): an entry another client stamped a moment ago by its own
    reading is older than 0 s here too. Bad arguments raise ``InvalidOption`` here, before any query is sent."""
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


def requeued_buckets(entries: list[dict[str, Any]], *, now: dt.datetime) -> list[dict[str, Any]]:
    """Fresh buckets holding dead-letter or quarantine entries, claimable now. Messages keep their ids and
    get their tries reset; they are grouped by codec, group and priority (a bucket holds one level) and split so that
    no bucket exceeds the size limits."""
    docs = [doc for e in entries if e.get("kind") == "bucket" for doc in requeued_original(e, now=now)]
    by_codec: dict[tuple[str, str | None, int], list[Slot]] = {}
    for e in entries:
        if e.get("kind") != "bucket":
            enqueued = as_utc(e["enqueued_at"]) if e.get("enqueued_at") else None
            by_codec.setdefault((e["enc"], e.get("g"), stored_priority(e)), []).append(
                Slot(payload=e["p"], headers=e.get("h"), key=e.get("k"), tries=0, origin=str(e["_id"]),
                     enqueued_at=enqueued))
    for (codec, group, priority), slots in by_codec.items():  # a dead letter of a group goes back at its end
        docs += bucket_documents(slots, codec=codec, created=now, due=now, group=group, priority=priority)
    return docs


def requeued_original(entry: dict[str, Any], *, now: dt.datetime) -> list[dict[str, Any]]:
    """A quarantined whole bucket put back, claimable now and unclaimed, under a new ``_id``: its old one is
    taken by the tombstone its quarantine left. A well-formed one is rebuilt from its unfinished messages,
    which keep their ids and tries (split if the per-slot ids make it too large); a malformed one goes back
    as it was, to be quarantined again unless it was mended."""
    doc = dict(entry["doc"])
    try:
        bucket = parse_bucket(doc)
    except MalformedBucket:
        doc.update(_id=ObjectId(), due=now, lease=None, c=0)
        return [doc]
    slots = [bucket.slot(i, tries=bucket.base_tries[i]) for i in range(bucket.size) if i not in bucket.done]
    return bucket_documents(slots, codec=bucket.codec, created=now, due=now, group=bucket.group,
                            priority=bucket.priority)

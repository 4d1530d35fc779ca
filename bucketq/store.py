"""The queue's collections and the few server operations the shells run, with retries on transient errors.

Collections of queue ``name``: ``name`` (buckets), ``name.dead``, ``name.quarantine``, ``name.inbox``,
``name.control`` (operator controls: the pause document), ``name.groups`` (locks of ordered groups).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bson.codec_options import DatetimeConversion
from pymongo import ReturnDocument, WriteConcern
from pymongo.errors import BulkWriteError, ConnectionFailure, DuplicateKeyError, OperationFailure, PyMongoError

from bucketq.control import PauseGate
from bucketq.core import claims, groups
from bucketq.core.control import PAUSE, initial_pause
from bucketq.core.format import CONTROL_SUFFIX, DEAD_SUFFIX, GROUPS_SUFFIX, INBOX_SUFFIX, QUARANTINE_SUFFIX
from bucketq.core.retry import RetrySchedule

T = TypeVar("T")
DUPLICATE_KEY = 11000


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` when the running task was cancelled. A cancel that arrives during a driver call
    can come back as a ``PyMongoError``, or not at all; a loop that would retry or sleep on checks here, so that
    ``close()`` does not wait on it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def retrying(op: Callable[[bool], Awaitable[T]], *, timeout_s: float) -> T:
    """Run ``op(retry)`` until it succeeds, retrying transient errors with backoff for up to ``timeout_s``.
    ``retry`` tells the operation that an earlier attempt may already have been applied."""
    schedule = RetrySchedule(timeout_s, time.monotonic())
    retry = False
    while True:
        try:
            return await op(retry)
        except PyMongoError as exc:
            raise_if_cancelled()
            wait = schedule.after(exc, time.monotonic())
            if wait is None:
                raise
        retry = True
        await asyncio.sleep(wait)


class Store:
    def __init__(self, database: Any, name: str, *, write_concern: int | str | None = None,
                 op_timeout_s: float = 30.0) -> None:
        wc: dict[str, Any] = {"write_concern": WriteConcern(w=write_concern)} if write_concern is not None else {}
        # A hand-made date beyond Python's datetime (year 1 to 9999) must not make every read of its document
        # raise: such dates come back as ``DatetimeMS``, which the format validation refuses (quarantine).
        wc["codec_options"] = database.codec_options.with_options(
            tz_aware=True, tzinfo=dt.timezone.utc, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
        self.database = database
        self.name = name
        self.buckets = database[name].with_options(**wc)
        self.dead = database[name + DEAD_SUFFIX].with_options(**wc)
        self.quarantine = database[name + QUARANTINE_SUFFIX].with_options(**wc)
        self.inbox = database[name + INBOX_SUFFIX].with_options(**wc)
        self.control = database[name + CONTROL_SUFFIX].with_options(**wc)
        self.groups = database[name + GROUPS_SUFFIX].with_options(**wc)
        self.pause = PauseGate(self.control)  # shared: a pause this process writes holds for its consumer at once
        self.op_timeout_s = op_timeout_s

    async def ensure_indexes(self) -> None:
        """Claims sort by ``due``; tombstones, dead letters and quarantine are listed or purged by time.
        (The test server accepts and ignores non-unique indexes.)"""
        await self.buckets.create_index("due")
        await self.buckets.create_index("fin.at", sparse=True)
        # live group buckets only (ungrouped ones and tombstones have neither field)
        await self.buckets.create_index([("g", 1), ("s", 1)], sparse=True)
        await self.dead.create_index("at")
        await self.quarantine.create_index("at")
        await self.inbox.create_index("at")
        await self.control.update_one(PAUSE, initial_pause(), upsert=True)  # never overwrites a pause

    # -- producer ------------------------------------------------------------------------------------------

    async def insert_new(self, collection: Any, docs: list[dict], *,
                         duplicate_is_mine: Callable[[dict], Awaitable[bool]] | None = None
                         ) -> dict[Any, BaseException]:
        """Insert documents whose ``_id`` the client made. A duplicate key on ``_id`` means the document is
        already there (an earlier attempt got through), so it counts as stored; with ``duplicate_is_mine``, only
        when that says so (a stream's sequence may hold a reader's gap marker instead). Returns the ``_id``s that
        failed for good, with their errors; raises on transient errors so the caller can retry."""
        duplicates: list[dict] = []
        failed: dict[Any, BaseException] = {}
        try:
            await collection.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            for err in exc.details.get("writeErrors", []):
                if err.get("code") == DUPLICATE_KEY:
                    duplicates.append(docs[err["index"]])
                    continue
                failed[docs[err["index"]]["_id"]] = OperationFailure(err.get("errmsg", "write failed"), err.get("code"))
            if exc.details.get("writeConcernErrors"):
                raise ConnectionFailure(f"write concern not satisfied: {exc.details['writeConcernErrors']}") from exc
        except DuplicateKeyError:
            duplicates = docs
        if duplicate_is_mine is not None:
            for doc in duplicates:
                if not await duplicate_is_mine(doc):
                    failed[doc["_id"]] = DuplicateKeyError(f"_id {doc['_id']!r} holds another document", DUPLICATE_KEY)
        return failed

    async def insert_copies(self, collection: Any, docs: list[dict]) -> None:
        """Insert idempotent copies (retry buckets, dead letters, quarantine entries): failures raise."""
        if not docs:
            return

        async def op(retry: bool) -> None:
            failed = await self.insert_new(collection, docs)
            if failed:
                raise next(iter(failed.values()))

        await retrying(op, timeout_s=self.op_timeout_s)

    # -- consumer ------------------------------------------------------------------------------------------

    async def claim(self, spec: tuple[dict, dict, list]) -> dict | None:
        query, update, sort = spec
        # Not retried: a claim that got through but whose reply was lost simply expires with its lease.
        return await self.buckets.find_one_and_update(query, update, sort=sort, return_document=ReturnDocument.AFTER)

    async def update_fenced(self, query: dict, update: dict, *, mine: dict | None = None,
                            collection: Any = None) -> bool:
        """Apply a write fenced by the claimant's token; True when it was applied, False when it was refused
        (the lease was lost). A retry after an ambiguous error that matches nothing counts as applied only if
        ``mine`` matches: a filter that nothing but this token's own earlier attempt can satisfy (a release
        clears the token but records it). Without ``mine``, such a retry means the lease was lost: done slots
        or a missing bucket may be another claimant's work, never proof of ours. ``collection``: another than
        the buckets' (a stream's claims)."""
        target = self.buckets if collection is None else collection

        async def op(retry: bool) -> bool:
            result = await target.update_one(query, update)
            return result.matched_count == 1 or (
                retry and mine is not None and await target.find_one(mine, {"_id": 1}) is not None)

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def finish_fenced(self, query: dict, tombstone: dict, mine: dict) -> bool:
        """Replace a finished bucket by its tombstone (see ``claims.finish``); True when this token's write
        did it. A retry that finds the bucket gone or finished by someone else is refused."""

        async def op(retry: bool) -> bool:
            result = await self.buckets.replace_one(query, tombstone)
            return result.matched_count == 1 or (retry and await self._matches(mine))

        return await retrying(op, timeout_s=self.op_timeout_s)

    # -- ordered groups (core.groups) ----------------------------------------------------------------------

    async def number_groups(self, docs: list[dict]) -> None:
        """Give the group buckets of ``docs`` not yet numbered their places (``s``), in list order, with one
        counter update. A retry after an error numbers only those still without a place."""
        unnumbered = [doc for doc in docs if "g" in doc and "s" not in doc]
        if not unnumbered:
            return
        query, update = groups.next_places(len(unnumbered))
        counter = await self.groups.find_one_and_update(query, update, upsert=True,
                                                        return_document=ReturnDocument.AFTER)
        for place, doc in enumerate(unnumbered, counter["seq"] - len(unnumbered) + 1):
            doc["s"] = place

    async def lock_group(self, query: dict, update: dict, mine: dict) -> bool:
        """Take a group's lock (``groups.acquire``); False when someone else holds it. A retry after a lost
        reply that finds the lock taken counts as ours only if ``mine`` (our token) matches."""

        async def op(retry: bool) -> bool:
            try:
                await self.groups.update_one(query, update, upsert=True)
                return True
            except DuplicateKeyError:
                return retry and await self.groups.find_one(mine, {"_id": 1}) is not None

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def extend_group(self, mine: dict, update: dict) -> bool:
        """Extend a lock we hold (fenced by ``mine``); False when it is no longer ours."""

        async def op(retry: bool) -> bool:
            return (await self.groups.update_one(mine, update)).matched_count == 1

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def unlock_group(self, mine: dict) -> None:
        """Delete a lock we hold (fenced by ``mine``); a retry that deletes nothing after a lost reply is fine:
        the lock is gone either way, and someone else's is never matched."""
        await retrying(lambda _: self.groups.delete_one(mine), timeout_s=self.op_timeout_s)

    async def group_lock(self, group: str) -> dict | None:
        return await self.groups.find_one({"_id": group})

    async def next_due(self, after: dt.datetime) -> dt.datetime | None:
        """The earliest ``due`` after ``after`` among live buckets (an unclaimed bucket's due time, or a claimed
        one's lease end), or None: one document read through the ``due`` index."""
        doc = await self.buckets.find_one({"due": {"$gt": after, "$lt": claims.TOMBSTONE_DUE}}, {"_id": 0, "due": 1},
                                          sort=[("due", 1)])
        return doc["due"] if doc is not None else None

    async def first_bucket(self, query: dict, sort: list) -> dict | None:
        return await self.buckets.find_one(query, {"_id": 1, "w": 1, "lease": 1}, sort=sort)

    async def wake(self, query: dict, update: dict) -> None:
        await retrying(lambda _: self.buckets.update_one(query, update), timeout_s=self.op_timeout_s)

    async def _matches(self, query: dict) -> bool:
        return await self.buckets.find_one(query, {"_id": 1}) is not None

    async def reap_tombstones(self, query: dict) -> int:
        return (await self.buckets.delete_many(query)).deleted_count

    async def quarantine_bucket(self, entry: dict, query: dict, tombstone: dict, mine: dict) -> bool:
        """Move a bucket to quarantine: the copy first, then the fenced finish."""
        await self.insert_copies(self.quarantine, [entry])
        return await self.finish_fenced(query, tombstone, mine)

    async def known_keys(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        cursor = self.inbox.find({"_id": {"$in": keys}}, {"_id": 1})
        return {d["_id"] for d in await cursor.to_list(None)}

    async def record_keys(self, keys: list[str], now: dt.datetime) -> None:
        await self.insert_copies(self.inbox, [{"_id": k, "at": now} for k in keys])

    async def aggregate(self, collection: Any, pipeline: list[dict], **options: Any) -> list[dict]:
        cursor = await collection.aggregate(pipeline, **options)
        return await cursor.to_list(None)

    async def insert_buckets(self, docs: list[dict], *, session: Any = None) -> None:
        """Insert buckets made whole outside the producer (``push(session=...)``, the outbox relay). With a
        session: once, in its transaction, whose errors are the caller's to handle (a retry belongs to the whole
        transaction). Without: retried; a duplicate key means that bucket is already stored; group buckets (a
        requeue) are numbered first, to go to the end of their groups."""
        if session is not None:
            await self.buckets.insert_many(docs, session=session)
        else:
            await retrying(lambda _: self.number_groups(docs), timeout_s=self.op_timeout_s)
            await self.insert_copies(self.buckets, docs)

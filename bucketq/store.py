"""The queue's collections and the few server operations the shells run, with retries on transient errors.

Collections of queue ``name``: ``name`` (buckets), ``name.dead``, ``name.quarantine``, ``name.inbox``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pymongo import ReturnDocument, WriteConcern
from pymongo.errors import BulkWriteError, ConnectionFailure, DuplicateKeyError, OperationFailure, PyMongoError

T = TypeVar("T")
DUPLICATE_KEY = 11000
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


def is_transient(exc: BaseException) -> bool:
    """Errors after which the operation may or may not have been applied, and a retry may succeed."""
    if isinstance(exc, ConnectionFailure):  # includes AutoReconnect, NetworkTimeout, NotPrimaryError
        return True
    if isinstance(exc, PyMongoError) and exc.has_error_label("RetryableWriteError"):
        return True
    return False


async def retrying(op: Callable[[bool], Awaitable[T]], *, timeout_s: float) -> T:
    """Run ``op(retry)`` until it succeeds, retrying transient errors with backoff for up to ``timeout_s``.
    ``retry`` tells the operation that an earlier attempt may already have been applied."""
    deadline = time.monotonic() + timeout_s
    delay = RETRY_FIRST_S
    attempt = 0
    while True:
        try:
            return await op(attempt > 0)
        except PyMongoError as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
        attempt += 1
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(RETRY_MAX_S, delay * 2)


class Store:
    def __init__(self, database: Any, name: str, *, write_concern: int | str | None = None,
                 op_timeout_s: float = 30.0) -> None:
        wc = {"write_concern": WriteConcern(w=write_concern)} if write_concern is not None else {}
        self.database = database
        self.name = name
        self.buckets = database[name].with_options(**wc)
        self.dead = database[f"{name}.dead"].with_options(**wc)
        self.quarantine = database[f"{name}.quarantine"].with_options(**wc)
        self.inbox = database[f"{name}.inbox"].with_options(**wc)
        self.op_timeout_s = op_timeout_s

    async def ensure_indexes(self) -> None:
        """Claims sort by ``due``; dead letters and quarantine are listed by time; the inbox is purged by time.
        (The test server accepts and ignores non-unique indexes.)"""
        await self.buckets.create_index("due")
        await self.dead.create_index("at")
        await self.quarantine.create_index("at")
        await self.inbox.create_index("at")

    # -- producer ------------------------------------------------------------------------------------------

    async def insert_new(self, collection: Any, docs: list[dict]) -> dict[Any, BaseException]:
        """Insert documents whose ``_id`` the client made. A duplicate key on ``_id`` means the document is
        already there (an earlier attempt got through), so it counts as stored. Returns the ``_id``s that
        failed for good, with their errors; raises on transient errors so the caller can retry."""
        try:
            await collection.insert_many(docs, ordered=False)
            return {}
        except BulkWriteError as exc:
            failed: dict[Any, BaseException] = {}
            for err in exc.details.get("writeErrors", []):
                if err.get("code") == DUPLICATE_KEY:
                    continue
                failed[docs[err["index"]]["_id"]] = OperationFailure(err.get("errmsg", "write failed"), err.get("code"))
            if exc.details.get("writeConcernErrors"):
                raise ConnectionFailure(f"write concern not satisfied: {exc.details['writeConcernErrors']}")
            return failed
        except DuplicateKeyError:
            return {}

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

    async def update_fenced(self, query: dict, update: dict) -> bool:
        async def op(retry: bool) -> bool:
            result = await self.buckets.update_one(query, update)
            return result.matched_count == 1 or (retry and await self._applied_before(query, update))

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def delete_fenced(self, query: dict) -> bool:
        async def op(retry: bool) -> bool:
            result = await self.buckets.delete_one(query)
            # On a retry, "already gone" is the earlier attempt's doing (or the bucket was finished by a
            # consumer that took it over; either way nothing of it is left to do).
            return result.deleted_count == 1 or (retry and await self.buckets.find_one({"_id": query["_id"]}) is None)

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def _applied_before(self, query: dict, update: dict) -> bool:
        """After an ambiguous error, did the earlier attempt of this fenced update get through? A release
        clears the token, so the retry matches nothing; the slots it marked done tell."""
        doc = await self.buckets.find_one({"_id": query["_id"]}, {"done": 1})
        marked = update.get("$addToSet", {}).get("done", {}).get("$each", [])
        return doc is not None and bool(marked) and set(marked) <= set(doc.get("done", []))

    async def delete_bucket_into_quarantine(self, entry: dict, query: dict) -> bool:
        """Move a bucket to quarantine: the copy first, then the fenced delete."""
        await self.insert_copies(self.quarantine, [entry])
        return await self.delete_fenced(query)

    async def known_keys(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        cursor = self.inbox.find({"_id": {"$in": keys}}, {"_id": 1})
        return {d["_id"] for d in await cursor.to_list(None)}

    async def record_keys(self, keys: list[str], now: dt.datetime) -> None:
        await self.insert_copies(self.inbox, [{"_id": k, "at": now} for k in keys])

    async def aggregate(self, collection: Any, pipeline: list[dict]) -> list[dict]:
        cursor = await collection.aggregate(pipeline)
        return await cursor.to_list(None)

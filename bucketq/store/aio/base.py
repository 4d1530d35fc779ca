"""What every store shares: retries of transient errors, and the inserts of documents whose ``_id`` the client
made (a duplicate key means an earlier attempt got through). Written async once; ``bucketq.store.sync`` is
generated from it (``devtools/unasync.py``)."""

from __future__ import annotations

import asyncio  # async-only
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bson.codec_options import DatetimeConversion
from pymongo import WriteConcern
from pymongo.errors import BulkWriteError, ConnectionFailure, DuplicateKeyError, OperationFailure, PyMongoError

from bucketq.core.retry import RetrySchedule

T = TypeVar("T")
DUPLICATE_KEY = 11000


def collections(database: Any, name: str, write_concern: int | str | None, *suffixes: str) -> list[Any]:
    """The collections ``name + suffix``, as every store reads and writes them: with ``write_concern`` (None:
    the database's), dates aware in UTC. A hand-made date beyond Python's datetime (year 1 to 9999) must not
    make every read of its document raise: such dates come back as ``DatetimeMS``, which the format validation
    refuses."""
    options: dict[str, Any] = {"write_concern": WriteConcern(w=write_concern)} if write_concern is not None else {}
    options["codec_options"] = database.codec_options.with_options(
        tz_aware=True, tzinfo=dt.timezone.utc, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
    return [database[name + suffix].with_options(**options) for suffix in suffixes]


# async-only: begin
def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` when the running task was cancelled. A cancel that arrives during a driver call
    can come back as a ``PyMongoError``, or not at all; a loop that would retry or sleep on checks here, so that
    ``close()`` does not wait on it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


# async-only: end
async def retrying(op: Callable[[bool], Awaitable[T]], *, timeout_s: float) -> T:
    """Run ``op(retry)`` until it succeeds, retrying transient errors with backoff for up to ``timeout_s``.
    ``retry`` tells the operation that an earlier attempt may already have been applied."""
    schedule = RetrySchedule(timeout_s, time.monotonic())
    retry = False
    while True:
        try:
            return await op(retry)
        except PyMongoError as exc:
            raise_if_cancelled()  # async-only
            wait = schedule.after(exc, time.monotonic())
            if wait is None:
                raise
        retry = True
        await asyncio.sleep(wait)


async def insert_new(collection: Any, docs: list[dict], *,
                     duplicate_is_mine: Callable[[dict], Awaitable[bool]] | None = None) -> dict[Any, BaseException]:
    """Insert documents whose ``_id`` the client made. A duplicate key on ``_id`` means the document is already
    there (an earlier attempt got through), so it counts as stored; with ``duplicate_is_mine``, only when that
    says so (a stream's sequence may hold a reader's gap marker instead). Returns the ``_id``s that failed for
    good, with their errors; raises on transient errors so the caller can retry, an unsatisfied write concern
    among them (the write may not last: the same policy for every store, async and sync)."""
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


async def insert_copies(collection: Any, docs: list[dict], *, timeout_s: float) -> None:
    """Insert idempotent copies (retry buckets, dead letters, quarantine entries), retried: failures raise."""
    if not docs:
        return

    async def op(retry: bool) -> None:
        failed = await insert_new(collection, docs)
        if failed:
            raise next(iter(failed.values()))

    await retrying(op, timeout_s=timeout_s)

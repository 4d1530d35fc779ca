"""Operator controls that are not methods of one ``Queue``: the pause gate consumers consult before each claim,
and finding the queues of a database (``bucketq.list_queues``, also the CLI's queue discovery)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from bucketq.connection import connect, reaching
from bucketq.core.format import QUEUE_SUFFIXES, SIDE_COLLECTION_SUFFIXES, STREAM_SUFFIXES
from bucketq.store.aio.catalog import collection_names, first_document

# Without a change stream, a consumer reads the pause document at most this often, so it stops claiming within
# this many seconds of a pause (plus one round trip); a paused one reads it again this often, so it starts
# again within this many seconds of a resume (plus one round trip). With one, a pause or resume announces
# itself (``PauseGate.changed``), and the document is read only after such an event or at a safety poll.
PAUSE_REFRESH_S = 1.0
# ... and with one, at most this often all the same (at the consumer's safety poll): what an event lost with a
# change stream (a server restart) would have announced.
PAUSE_WATCHED_REFRESH_S = 40.0
BUCKET_FIELDS = ("v", "due", "lease")  # in every bucket and every tombstone (docs/FORMAT.md)


class PauseGate:
    """Whether the queue is paused, as its ``Q.control`` document says (``read``: the store's
    ``read_pause``), read again once ``refresh_s`` has passed since the last read: one small read a second per
    consumer, not one per claim."""

    def __init__(self, read: Callable[[], Awaitable[bool]], refresh_s: float = PAUSE_REFRESH_S) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._paused = False
        self._read_at: float | None = None  # monotonic time of the last read; None: read before the next claim

    async def holds(self, *, watched: bool = False) -> bool:
        """True while the queue is paused (as last read): the caller must not claim a bucket. ``watched``: a
        change stream announces every write of the pause document (``changed``), so what was read holds until
        one does (or ``PAUSE_WATCHED_REFRESH_S`` passed)."""
        refresh_s = PAUSE_WATCHED_REFRESH_S if watched else self._refresh_s
        if self._read_at is None or time.monotonic() - self._read_at >= refresh_s:
            self.set(await self._read())
        return self._paused

    def changed(self) -> None:
        """The pause document was written (a change-stream event): read it before the next claim."""
        self._read_at = None

    def set(self, paused: bool) -> None:
        """What this process just wrote or read: in effect at once, without waiting for the next read."""
        self._paused = paused
        self._read_at = time.monotonic()


# -- finding queues --------------------------------------------------------------------------------------------

async def list_queues(target: Any, *, db: str | None = None) -> list[str]:
    """The names of the queues in a database, sorted. ``target`` is what ``Queue`` takes: a URI, an
    ``AsyncMongoClient``, an ``AsyncDatabase`` or a Motor client or database; ``db`` picks the database.
    Reads only: no collection is made and no ``Queue`` is opened."""
    connection = connect(target, db)
    try:
        with reaching(connection.uri, "listing the collections"):
            return await queue_names(connection.database)
    finally:
        await connection.close()


async def queue_names(database: Any) -> list[str]:
    """The queues of ``database`` (see ``is_queue``), in name order."""
    collections = await collection_names(database)
    return [n for n in sorted(collections) if await is_queue(database, n, collections)]


async def is_queue(database: Any, name: str, collections: set[str]) -> bool:
    """Whether collection ``name`` holds a queue's buckets, told without writing and without opening a ``Queue``
    on it: a side collection beside it (``.dead``, ``.quarantine``, ...: a queue's first write makes them),
    or else a first document with the fields every bucket and tombstone has. Other collections are never
    read beyond that one document."""
    if name.endswith(SIDE_COLLECTION_SUFFIXES) or any(name + suffix in collections for suffix in STREAM_SUFFIXES):
        return False  # a side collection, or a stream
    if any(name + suffix in collections for suffix in QUEUE_SUFFIXES):
        return True
    first = await first_document(database, name, BUCKET_FIELDS)
    return first is not None and all(field in first for field in BUCKET_FIELDS)

"""Finding the queues of a database without opening them (``bucketq.list_queues``, also the CLI's queue
discovery)."""

from __future__ import annotations

from typing import Any

from bucketq.core.format import QUEUE_SUFFIXES, SIDE_COLLECTION_SUFFIXES, STREAM_SUFFIXES
from bucketq.shell.connection import connect, reaching
from bucketq.store.aio.catalog import collection_names, first_document

BUCKET_FIELDS = ("v", "due", "lease")  # in every bucket and every tombstone (docs/FORMAT.md)


async def list_queues(target: Any, *, db: str | None = None) -> list[str]:
    """The names of the queues in a database, sorted. ``target`` is what ``Queue`` takes: a URI, an
    ``AsyncMongoClient``, an ``AsyncDatabase`` or a Motor client or database; ``db`` picks the database.
    Reads only: no collection is made and no ``Queue`` is opened."""
    connection = connect(target, db)
    try:
        with reaching(connection.uri, "listing the collections", client=connection.database.client):
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

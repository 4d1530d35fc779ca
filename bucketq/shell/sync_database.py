"""The database a synchronous shell (``BatchQueue``, ``SyncQueue``) works on, from what its user passed."""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient
from pymongo.database import Database

from bucketq.errors import InvalidOption
from bucketq.memory import MemoryClient, MemoryDatabase, SyncDatabase
from bucketq.shell.connection import client_of

SyncTarget = str | MongoClient | Database | SyncDatabase | MemoryDatabase | MemoryClient


def sync_database(target: SyncTarget, db: str | None, what: str) -> tuple[Any, MongoClient | None]:
    """The database named ``db`` (default: the URI's, else "bucketq") of ``target``: a URI, a ``MongoClient``
    or a ``Database``; for tests without a server also a ``bucketq.memory`` database (its ``sync`` view) or
    client. Returns it with the client made from a URI, which the caller closes (None otherwise)."""
    owned: MongoClient | None = None
    database: Any
    if isinstance(target, str):
        owned = client_of(target, MongoClient)
        database = owned[db] if db else owned.get_default_database("bucketq")
    elif isinstance(target, MongoClient):
        database = target[db] if db else target.get_default_database("bucketq")
    elif isinstance(target, Database):
        database = target if db is None else target.client[db]
    elif isinstance(target, (SyncDatabase, MemoryDatabase)):
        database = target.sync if isinstance(target, MemoryDatabase) else target
        database = database if db is None else database.client[db].sync
    elif isinstance(target, MemoryClient):
        database = target[db or "bucketq"].sync
    else:
        raise InvalidOption(f"{what} needs a URI, a MongoClient or a Database (or a bucketq.memory database), "
                            f"got {type(target).__name__}")
    return database, owned

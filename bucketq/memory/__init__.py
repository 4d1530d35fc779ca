"""An in-memory MongoDB database that stands where bucketq expects PyMongo's ``AsyncDatabase``: for unit
tests that need no server, and for fault tests that need exact control.

    db = MemoryDatabase("shop")
    q = bucketq.Queue(db, name="orders")
    db.faults.lose_reply("update", collection="orders")     # the next update is applied, its reply lost
    ...
    [op.command for op in db.operations]                     # every operation, in order

It implements the part of MongoDB that bucketq (and a test poking at its documents) uses, with MongoDB's
semantics rather than Python's: documents are stored as BSON, so what comes back has the types and
precision a driver returns (dates in milliseconds, tz-aware or not per ``codec_options``, ``Int64``,
out-of-range dates as ``DatetimeMS``) and anything a driver cannot encode fails alike; queries compare
values in BSON order with type bracketing (a date never matches ``$lte`` a string); ``$inc`` on a
non-number, ``$addToSet`` on a non-array, a path through a null and an int64 overflow are write errors; a
duplicate ``_id`` raises ``DuplicateKeyError`` or ``BulkWriteError`` with code 11000, as PyMongo raises them;
documents over 16 MiB are refused (``DocumentTooLarge`` on insert, write error 17419 on update); the
aggregation expressions of ``core/stats.py`` compare across types in BSON order. Change streams deliver
insert, update (``updateDescription`` by top-level field; ``updateLookup``) and replace events. What it
does not implement raises ``Unsupported``.

Why not mongomock (4.3.0, evaluated for this): it gets wrong exactly what bucketq relies on. ``$inc`` on a
string raises Python's ``TypeError`` instead of a write error (the consumer's fallback for such buckets
never runs); ``$addToSet: {$each}`` adds duplicates already in the array; ``$set`` through a null field
does nothing instead of failing; ``$inc`` past int64 makes an unencodable Python int; the stats
aggregation counts no message in flight (``$not``/``$ifNull`` expressions); ``with_options(codec_options=
...)`` with a ``tzinfo`` (as ``Store`` passes) raises ``NotImplementedError``; no ``isMaster`` command, no
change streams, no size limit. tests/test_memory.py runs bucketq's own operations on both engines and
checks that this one agrees with mongomock wherever mongomock is right, and with the test server.
"""

from bucketq.memory.client import (
    AsyncCursor,
    MemoryClient,
    MemoryCollection,
    MemoryDatabase,
)
from bucketq.memory.data import Cursor, SyncCollection, SyncDatabase
from bucketq.memory.engine import Unsupported, compare, matches
from bucketq.memory.faults import Fault, Faults, Operation, OperationLog
from bucketq.memory.streams import ChangeStream

__all__ = [
    "AsyncCursor", "ChangeStream", "Cursor", "Fault", "Faults", "MemoryClient", "MemoryCollection", "MemoryDatabase",
    "Operation", "OperationLog", "SyncCollection", "SyncDatabase", "Unsupported", "compare", "matches",
]

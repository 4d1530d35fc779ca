"""The data of ``bucketq.memory`` and its synchronous interface, with PyMongo's ``Database`` and
``Collection`` methods: the engine under the async one, and the view tests seed and inspect the data
through (it records no operation and takes no fault)."""

from __future__ import annotations

import copy
import datetime as dt
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import bson
from bson import ObjectId
from bson.codec_options import CodecOptions
from pymongo import (
    DeleteMany,
    DeleteOne,
    InsertOne,
    ReplaceOne,
    ReturnDocument,
    UpdateMany,
    UpdateOne,
    WriteConcern,
)
from pymongo.errors import (
    BulkWriteError,
    DocumentTooLarge,
    DuplicateKeyError,
    InvalidOperation,
    OperationFailure,
    WriteError,
)
from pymongo.results import (
    BulkWriteResult,
    DeleteResult,
    InsertManyResult,
    InsertOneResult,
    UpdateResult,
)

from bucketq.core.scans import SCAN_COMMENT
from bucketq.memory.engine import (
    STORED,
    UPDATE_OPERATORS,
    UTC,
    Unsupported,
    aggregate_documents,
    apply_update,
    compare,
    is_operators,
    matches,
    project,
    sort_documents,
    sort_spec,
    upsert_seed,
    write_error,
)
from bucketq.memory.planner import describe, served

if TYPE_CHECKING:
    from bucketq.memory.streams import Streams

MAX_BSON_SIZE = 16 * 1024 * 1024
Change = Callable[..., dict[str, Any]]  # (document, inserting=False) -> the document as it becomes


@dataclass
class _Stored:
    raw: bytes  # the document as BSON, decoded afresh for each reader with the reader's codec options
    doc: dict[str, Any]  # decoded once with STORED, for matching; never mutated


def id_key(value: Any) -> bytes:
    return bson.encode({"": value})


def as_stored(value: Any, options: CodecOptions) -> Any:
    """``value`` as the server would see it: through BSON (dates to milliseconds, tuples to arrays, ...)."""
    if value is None:
        return None
    return bson.decode(bson.encode({"v": value}, codec_options=options), codec_options=STORED)["v"]


class Namespace:
    """One collection's documents, in insertion (natural) order, keyed by ``_id``."""

    def __init__(self) -> None:
        self.docs: dict[bytes, _Stored] = {}
        self.indexes: dict[str, dict[str, Any]] = {"_id_": {"key": [("_id", 1)]}}


class Cursor:
    """The documents of a find or an aggregation, with PyMongo's cursor methods. The query runs at the first
    read, so ``sort``/``skip``/``limit`` may be chained until then."""

    def __init__(self, load: Callable[[Cursor], list[Mapping[str, Any]]], *, sort: Any = None, skip: int = 0,
                 limit: int = 0) -> None:
        self._load = load
        self.spec_sort = sort_spec(sort)
        self.spec_skip = skip
        self.spec_limit = limit
        self._docs: deque[Mapping[str, Any]] | None = None
        self.alive = True

    def sort(self, key: Any, direction: int = 1) -> Cursor:
        self._check_unread()
        self.spec_sort = sort_spec(key) if not isinstance(key, str) else [(key, direction)]
        return self

    def skip(self, n: int) -> Cursor:
        self._check_unread()
        self.spec_skip = n
        return self

    def limit(self, n: int) -> Cursor:
        self._check_unread()
        self.spec_limit = n
        return self

    def batch_size(self, n: int) -> Cursor:
        return self

    def _check_unread(self) -> None:
        if self._docs is not None:
            raise InvalidOperation("cannot set options after executing query")

    def _fill(self, docs: list[Mapping[str, Any]]) -> None:
        self._docs = deque(docs)

    def _take(self, n: int | None) -> list[Mapping[str, Any]]:
        assert self._docs is not None
        count = len(self._docs) if n is None else min(n, len(self._docs))
        out = [self._docs.popleft() for _ in range(count)]
        self.alive = bool(self._docs)
        return out

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> Mapping[str, Any]:
        if self._docs is None:
            self._fill(self._load(self))
        taken = self._take(1)
        if not taken:
            raise StopIteration
        return taken[0]

    next = __next__

    def to_list(self, length: int | None = None) -> list[Mapping[str, Any]]:
        if self._docs is None:
            self._fill(self._load(self))
        return self._take(length)

    def close(self) -> None:
        self._docs = deque()
        self.alive = False

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncCollection:
    """A collection with PyMongo's synchronous ``Collection`` methods. It neither records operations nor
    takes faults: it is the direct view tests use to seed and inspect (``MemoryDatabase.sync``), and the
    engine under ``MemoryCollection``."""

    def __init__(self, database: SyncDatabase, name: str, codec_options: CodecOptions,
                 write_concern: WriteConcern) -> None:
        self.database = database
        self.name = name
        self.codec_options = codec_options
        self.write_concern = write_concern

    @property
    def full_name(self) -> str:
        return f"{self.database.name}.{self.name}"

    @property
    def _ns(self) -> Namespace:
        """The collection's documents; an empty stand-in while it does not exist (reads create nothing)."""
        return self.database.client.namespaces.get((self.database.name, self.name)) or Namespace()

    @property
    def _created(self) -> Namespace:
        """The collection's documents, the collection created if need be (by a write, as in MongoDB)."""
        return self.database.client.namespaces.setdefault((self.database.name, self.name), Namespace())

    def __getitem__(self, name: str) -> SyncCollection:
        return self.database[f"{self.name}.{name}"]

    def with_options(self, codec_options: CodecOptions | None = None, write_concern: WriteConcern | None = None,
                     **ignored: Any) -> SyncCollection:
        return type(self)(self.database, self.name, codec_options or self.codec_options,
                          write_concern or self.write_concern)

    # -- reading

    def _out(self, stored: _Stored, projection: Any = None) -> Mapping[str, Any]:
        if projection is None:
            return bson.decode(stored.raw, codec_options=self.codec_options)
        return self._decoded(project(stored.doc, projection))

    def _decoded(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        return bson.decode(bson.encode(doc, codec_options=STORED), codec_options=self.codec_options)

    def _matching(self, query: Any) -> list[_Stored]:
        query = as_stored(query, self.codec_options) or {}
        if not isinstance(query, Mapping):
            raise TypeError("filter must be a mapping")
        matches({}, query)  # what the server refuses, it refuses in an empty collection too
        wanted = query.get("_id")
        if isinstance(wanted, (ObjectId, str)):  # types whose equality is their BSON's: look the one up
            stored = self._ns.docs.get(id_key(wanted))
            return [stored] if stored is not None and matches(stored.doc, query) else []
        return [s for s in self._ns.docs.values() if matches(s.doc, query)]

    def _plan(self, query: Any, sort: Any, comment: Any) -> None:
        """With the client's ``notablescan``, refuse a query that a client sent (not this view's own) and that no
        index of the collection serves, as MongoDB does with that server parameter (``bucketq.memory.planner``);
        whole-collection reads marked with ``comment=SCAN_COMMENT`` pass."""
        client = self.database.client
        if (not (client.notablescan and client.receiving) or comment == SCAN_COMMENT
                or (self.database.name, self.name) not in client.namespaces):
            return
        stored = as_stored(query, self.codec_options) or {}
        indexes = self._ns.indexes
        if not served(stored, sort_spec(sort), indexes):
            raise OperationFailure(f"no query solutions: no index serves filter {query!r}"
                                   f"{f' sort {sort_spec(sort)!r}' if sort else ''} on {self.full_name}, and running "
                                   f"with 'notablescan' (indexes: {describe(indexes)})", 291)

    def _ordered(self, stored: list[_Stored], sort: Any) -> list[_Stored]:
        spec = sort_spec(sort)
        if not spec:
            return stored
        order = sort_documents([s.doc for s in stored], spec)
        by_id = {id(s.doc): s for s in stored}
        return [by_id[id(d)] for d in order]

    def find(self, filter: Any = None, projection: Any = None, *, sort: Any = None, skip: int = 0, limit: int = 0,
             batch_size: int = 0, comment: Any = None, **ignored: Any) -> Cursor:
        def load(cursor: Cursor) -> list[Mapping[str, Any]]:
            self._plan(filter, cursor.spec_sort, comment)
            found = self._ordered(self._matching(filter), cursor.spec_sort)[cursor.spec_skip:]
            if cursor.spec_limit:
                found = found[:abs(cursor.spec_limit)]
            return [self._out(s, projection) for s in found]

        return Cursor(load, sort=sort, skip=skip, limit=limit)

    def find_one(self, filter: Any = None, projection: Any = None, **kwargs: Any) -> Mapping[str, Any] | None:
        if filter is not None and not isinstance(filter, Mapping):
            filter = {"_id": filter}
        return next(iter(self.find(filter, projection, limit=1, **kwargs)), None)

    def count_documents(self, filter: Any, comment: Any = None, **ignored: Any) -> int:
        self._plan(filter, None, comment)
        return len(self._matching(filter))

    def estimated_document_count(self, **ignored: Any) -> int:
        return len(self._ns.docs)

    def aggregate(self, pipeline: list[Mapping[str, Any]], comment: Any = None, **ignored: Any) -> Cursor:
        stages = as_stored(list(pipeline), self.codec_options)
        first = stages[0] if stages else {}
        query = first.get("$match", {}) if isinstance(first, Mapping) else {}
        after = stages[1 if "$match" in first else 0:]
        self._plan(query, after[0].get("$sort") if after and isinstance(after[0], Mapping) else None, comment)
        rows = aggregate_documents([s.doc for s in self._ns.docs.values()], stages)
        cursor = Cursor(lambda _: [])
        cursor._fill([self._decoded(r) for r in rows])
        return cursor

    def index_information(self) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self._ns.indexes)

    # -- writing

    def _result(self, result_type: type, raw: Any) -> Any:
        return result_type(raw, self.write_concern.acknowledged)

    def _store(self, doc: Mapping[str, Any]) -> _Stored:
        raw = bson.encode(doc, codec_options=self.codec_options)
        if len(raw) > MAX_BSON_SIZE:
            raise DocumentTooLarge(f"BSON document too large ({len(raw)} bytes) - the connected server supports "
                                   f"BSON document sizes up to {MAX_BSON_SIZE} bytes.")
        return _Stored(raw, bson.decode(raw, codec_options=STORED))

    def insert_many(self, documents: Iterable[MutableMapping[str, Any]], ordered: bool = True,
                    **ignored: Any) -> InsertManyResult:
        docs = list(documents) if not isinstance(documents, Mapping) else None
        if not docs:
            raise TypeError("documents must be a non-empty list")
        self._bulk([InsertOne(d) for d in docs], ordered)
        return InsertManyResult([d["_id"] for d in docs], self.write_concern.acknowledged)

    def insert_one(self, document: MutableMapping[str, Any], **ignored: Any) -> InsertOneResult:
        return InsertOneResult(self._insert_new(document), self.write_concern.acknowledged)

    def bulk_write(self, requests: Iterable[Any], ordered: bool = True, **ignored: Any) -> BulkWriteResult:
        """``InsertOne``, ``UpdateOne``, ``UpdateMany``, ``ReplaceOne``, ``DeleteOne``, ``DeleteMany``."""
        return self._result(BulkWriteResult, self._bulk(list(requests), ordered))

    def _bulk(self, requests: list[Any], ordered: bool) -> dict[str, Any]:
        """Run write requests in order; write errors are collected (after the first, an ordered bulk stops)
        and raised together as ``BulkWriteError``, with the counts of what was applied, as PyMongo does."""
        counts: dict[str, Any] = {"writeErrors": [], "writeConcernErrors": [], "nInserted": 0, "nUpserted": 0,
                                  "nMatched": 0, "nModified": 0, "nRemoved": 0, "upserted": []}
        for index, request in enumerate(requests):
            try:
                self._bulk_one(request, index, counts)
            except WriteError as exc:
                counts["writeErrors"].append({**(exc.details or {}), "index": index,
                                              "op": getattr(request, "_doc", None)})
                if ordered:
                    break
        if counts["writeErrors"]:
            raise BulkWriteError(counts)
        return counts

    def _bulk_one(self, request: Any, index: int, counts: dict[str, Any]) -> None:
        if isinstance(request, InsertOne):
            self._insert_new(request._doc)
            counts["nInserted"] += 1
            return
        if isinstance(request, (DeleteOne, DeleteMany)):
            counts["nRemoved"] += self._delete(request._filter, isinstance(request, DeleteMany)).deleted_count
            return
        if isinstance(request, ReplaceOne):
            change = self._replacer(request._doc)
        elif isinstance(request, (UpdateOne, UpdateMany)):
            change = self._updater(request._doc)
        else:
            raise TypeError(f"{request!r} is not a valid request")
        found, modified, upserted = self._modify(request._filter, change, many=isinstance(request, UpdateMany),
                                                 upsert=bool(request._upsert),
                                                 replacing=isinstance(request, ReplaceOne))
        counts["nMatched"] += len(found)
        counts["nModified"] += modified
        if upserted is not None:
            counts["nUpserted"] += 1
            counts["upserted"].append({"index": index, "_id": upserted})

    def _rewrite(self, stored: _Stored, change: Change, replacing: bool) -> bool:
        """Replace ``stored`` by ``change`` of a fresh copy of it; whether that changed anything."""
        doc = change(bson.decode(stored.raw, codec_options=STORED))
        raw = bson.encode(doc, codec_options=STORED)
        if len(raw) > MAX_BSON_SIZE:
            raise write_error(f"Resulting document after update is larger than {MAX_BSON_SIZE}", 17419)
        if raw == stored.raw:
            return False
        new = _Stored(raw, bson.decode(raw, codec_options=STORED))
        self._created.docs[id_key(stored.doc["_id"])] = new
        streams = self.database.client.streams
        if replacing:
            streams.publish(self.database.name, self.name, raw, operation="replace")
        else:
            streams.publish(self.database.name, self.name, raw, operation="update",
                            description=update_description(stored.doc, new.doc))
        return True

    def _insert_new(self, doc: MutableMapping[str, Any]) -> Any:
        ensure_id(doc)
        stored = self._store(doc)
        key = id_key(stored.doc["_id"])
        if key in self._created.docs:
            raise write_error(f"E11000 duplicate key error collection: {self.full_name} index: _id_ dup key: "
                               f"{{ _id: {stored.doc['_id']!r} }}", 11000, DuplicateKeyError, keyPattern={"_id": 1},
                               keyValue={"_id": stored.doc["_id"]})
        self._created.docs[key] = stored
        self.database.client.streams.publish(self.database.name, self.name, stored.raw)
        return stored.doc["_id"]

    def _modify(self, filter: Any, change: Change, *, many: bool = False, upsert: bool = False,
                sort: Any = None, comment: Any = None, replacing: bool = False) -> tuple[list[_Stored], int, Any]:
        """Apply ``change`` to the first (or every) matching document, or with ``upsert`` to a new one made from
        the filter's equalities when none matches. Returns (the matched documents as they were, how many
        changed, the upserted ``_id`` or None)."""
        self._plan(filter, sort, comment)
        found = self._ordered(self._matching(filter), sort)[: None if many else 1]
        if found or not upsert:
            return found, sum(self._rewrite(s, change, replacing) for s in found), None
        return [], 0, self._insert_new(change(upsert_seed(as_stored(filter, self.codec_options) or {}), True))

    def _updater(self, update: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Change:
        if not is_operators(update) or not all(k.startswith("$") for k in update):
            raise ValueError("update only works with $ operators")
        unknown = set(update) - UPDATE_OPERATORS
        if unknown:
            raise Unsupported(f"update operator {min(unknown)} is not implemented by bucketq.memory")
        normal = as_stored(update, self.codec_options)

        def change(doc: dict[str, Any], inserting: bool = False) -> dict[str, Any]:
            apply_update(doc, normal, inserting=inserting)
            return doc

        return change

    def _replacer(self, replacement: Mapping[str, Any]) -> Change:
        if any(k.startswith("$") for k in replacement):
            raise ValueError("replacement can not include $ operators")
        normal = as_stored(replacement, self.codec_options)

        def change(doc: dict[str, Any], inserting: bool = False) -> dict[str, Any]:
            if "_id" in doc and "_id" in normal and compare(normal["_id"], doc["_id"]) != 0:
                raise write_error("After applying the update, the (immutable) field '_id' was found to have been "
                                 "altered", 66)
            return {"_id": doc.get("_id", normal.get("_id", ObjectId())),
                    **{k: v for k, v in normal.items() if k != "_id"}}

        return change

    def _update_result(self, found: list[_Stored], modified: int, upserted: Any) -> UpdateResult:
        raw: dict[str, Any] = {"n": len(found) or int(upserted is not None), "nModified": modified, "ok": 1.0}
        if upserted is not None:
            raw["upserted"] = upserted
        return self._result(UpdateResult, raw)

    def update_one(self, filter: Any, update: Mapping[str, Any], upsert: bool = False, comment: Any = None,
                   **ignored: Any) -> UpdateResult:
        return self._update_result(*self._modify(filter, self._updater(update), upsert=upsert, comment=comment))

    def update_many(self, filter: Any, update: Mapping[str, Any], upsert: bool = False, comment: Any = None,
                    **ignored: Any) -> UpdateResult:
        return self._update_result(*self._modify(filter, self._updater(update), many=True, upsert=upsert,
                                                 comment=comment))

    def replace_one(self, filter: Any, replacement: Mapping[str, Any], upsert: bool = False, comment: Any = None,
                    **ignored: Any) -> UpdateResult:
        return self._update_result(*self._modify(filter, self._replacer(replacement), upsert=upsert, comment=comment,
                                                 replacing=True))

    def find_one_and_update(self, filter: Any, update: Mapping[str, Any], projection: Any = None, sort: Any = None,
                            upsert: bool = False, return_document: bool = ReturnDocument.BEFORE,
                            comment: Any = None, **ignored: Any) -> Mapping[str, Any] | None:
        found, _, upserted = self._modify(filter, self._updater(update), upsert=upsert, sort=sort, comment=comment)
        if return_document == ReturnDocument.BEFORE:
            return self._out(found[0], projection) if found else None
        key = id_key(found[0].doc["_id"] if found else upserted)
        return self._out(self._ns.docs[key], projection) if found or upserted is not None else None

    def _delete(self, filter: Any, many: bool, comment: Any = None) -> DeleteResult:
        self._plan(filter, None, comment)
        found = self._matching(filter)[: None if many else 1]
        for stored in found:
            del self._created.docs[id_key(stored.doc["_id"])]
        return self._result(DeleteResult, {"n": len(found), "ok": 1.0})

    def delete_one(self, filter: Any, comment: Any = None, **ignored: Any) -> DeleteResult:
        return self._delete(filter, False, comment)

    def delete_many(self, filter: Any, comment: Any = None, **ignored: Any) -> DeleteResult:
        return self._delete(filter, True, comment)

    def create_index(self, keys: Any, *, name: str | None = None, unique: bool = False, **options: Any) -> str:
        if unique:
            raise Unsupported("unique secondary indexes are not enforced by bucketq.memory")
        spec = [(keys, 1)] if isinstance(keys, str) else sort_spec(keys)
        name = name or "_".join(f"{k}_{d}" for k, d in spec)
        self._created.indexes[name] = {"key": spec, **options}
        return name

    def drop(self, **ignored: Any) -> None:
        self.database.drop_collection(self.name)


def update_description(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """An update event's ``updateDescription``, by top-level field (MongoDB names the fields changed inside a
    subdocument by dotted paths, ``lease.until``; the stages bucketq watches with look at top-level ones)."""
    return {"updatedFields": {k: v for k, v in after.items() if k not in before or compare(before[k], v) != 0},
            "removedFields": [k for k in before if k not in after]}


def ensure_id(doc: MutableMapping[str, Any]) -> Any:
    """Give ``doc`` an ``ObjectId`` ``_id`` if it has none, as PyMongo does on insert; return the ``_id``."""
    if "_id" not in doc and isinstance(doc, MutableMapping):
        doc["_id"] = ObjectId()
    return doc["_id"]


class Backing(Protocol):
    """What a synchronous view reads of the ``MemoryClient`` that holds its data (a protocol, so that this module
    does not import the client, which builds on it)."""

    namespaces: dict[tuple[str, str], Namespace]
    streams: Streams
    notablescan: bool  # refuse queries no index serves ...
    receiving: bool  # ... while the client runs an operation it received (not the view's own reads)


class SyncDatabase:
    """A database with PyMongo's synchronous ``Database`` methods, over the same data as its
    ``MemoryDatabase`` (``MemoryDatabase.sync``): no operations recorded, no faults."""

    def __init__(self, client: Backing, name: str, codec_options: CodecOptions,
                 write_concern: WriteConcern) -> None:
        self.client = client
        self.name = name
        self.codec_options = codec_options
        self.write_concern = write_concern

    def __getitem__(self, name: str) -> SyncCollection:
        return SyncCollection(self, name, self.codec_options, self.write_concern)

    def __getattr__(self, name: str) -> SyncCollection:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def get_collection(self, name: str, codec_options: CodecOptions | None = None,
                       write_concern: WriteConcern | None = None, **ignored: Any) -> SyncCollection:
        return self[name].with_options(codec_options=codec_options, write_concern=write_concern)

    def list_collection_names(self, **ignored: Any) -> list[str]:
        return sorted(c for d, c in self.client.namespaces if d == self.name)

    def list_collections(self, **ignored: Any) -> Cursor:
        cursor = Cursor(lambda _: [])
        cursor._fill([{"name": name, "type": "collection", "options": {}, "info": {"readOnly": False}}
                      for name in self.list_collection_names()])
        return cursor

    def drop_collection(self, name: str, **ignored: Any) -> None:
        self.client.namespaces.pop((self.name, name), None)

    def command(self, command: str | Mapping[str, Any], value: Any = 1, **ignored: Any) -> dict[str, Any]:
        name = command if isinstance(command, str) else next(iter(command))
        if name in ("isMaster", "ismaster", "hello"):
            now = dt.datetime.fromtimestamp(time.time(), UTC)  # by time.time: a test may move it
            return self._decoded({"ismaster": True, "isWritablePrimary": True, "localTime": now,
                                  "maxBsonObjectSize": MAX_BSON_SIZE, "maxMessageSizeBytes": 48_000_000,
                                  "maxWriteBatchSize": 100_000, "minWireVersion": 0, "maxWireVersion": 21,
                                  "readOnly": False, "ok": 1.0})
        if name == "ping":
            return {"ok": 1.0}
        if name == "buildInfo":
            return {"version": "0.0.0-bucketq-memory", "versionArray": [0, 0, 0, 0], "ok": 1.0}
        raise OperationFailure(f"no such command: '{name}' (bucketq.memory)", 59)

    def _decoded(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        return bson.decode(bson.encode(doc), codec_options=self.codec_options)

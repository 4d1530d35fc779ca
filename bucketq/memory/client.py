"""The async interface of ``bucketq.memory``: ``MemoryClient``, ``MemoryDatabase`` and ``MemoryCollection``
with the methods of PyMongo's ``AsyncMongoClient``, ``AsyncDatabase`` and ``AsyncCollection`` that bucketq
uses. Each operation is recorded and goes through the client's faults."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from bson import Timestamp
from bson.codec_options import CodecOptions
from pymongo import ReturnDocument, WriteConcern
from pymongo.errors import AutoReconnect, OperationFailure
from pymongo.results import (
    BulkWriteResult,
    DeleteResult,
    InsertManyResult,
    InsertOneResult,
    UpdateResult,
)

from bucketq.memory.data import (
    Cursor,
    Namespace,
    SyncCollection,
    SyncDatabase,
    ensure_id,
)
from bucketq.memory.faults import Faults, Operation, OperationLog
from bucketq.memory.streams import ChangeStream, Streams

T = TypeVar("T")
DEFAULT_DB = "bucketq"


class Runner(Protocol):
    """Runs ``apply`` as one recorded operation (``MemoryClient.run`` with the operation bound)."""

    def __call__(self, apply: Callable[[], T], /) -> Awaitable[T]: ...


class AsyncCursor:
    """An async cursor (``to_list``, ``async for``, ``next``, ``close``) whose query runs, as one recorded
    operation, at the first read."""

    def __init__(self, cursor: Cursor, run: Runner) -> None:
        self._cursor = cursor
        self._run = run

    def sort(self, key: Any, direction: int = 1) -> AsyncCursor:
        self._cursor.sort(key, direction)
        return self

    def skip(self, n: int) -> AsyncCursor:
        self._cursor.skip(n)
        return self

    def limit(self, n: int) -> AsyncCursor:
        self._cursor.limit(n)
        return self

    def batch_size(self, n: int) -> AsyncCursor:
        return self

    @property
    def alive(self) -> bool:
        return self._cursor.alive

    async def _load(self) -> None:
        if self._cursor._docs is None:  # an aggregation's cursor comes filled
            cursor = self._cursor
            await self._run(lambda: cursor._fill(cursor._load(cursor)))

    async def to_list(self, length: int | None = None) -> list[Mapping[str, Any]]:
        await self._load()
        return self._cursor.to_list(length)

    async def next(self) -> Mapping[str, Any]:
        await self._load()
        taken = self._cursor.to_list(1)
        if not taken:
            raise StopAsyncIteration
        return taken[0]

    def __aiter__(self) -> AsyncCursor:
        return self

    async def __anext__(self) -> Mapping[str, Any]:
        return await self.next()

    async def close(self) -> None:
        self._cursor.close()


class MemoryCollection:
    """A collection with PyMongo's ``AsyncCollection`` methods. Each operation is recorded in the client's
    ``operations`` and goes through its ``faults``; between its request and its reply the event loop runs
    (``latency`` seconds, at least one turn), as over a network."""

    def __init__(self, sync: SyncCollection, client: MemoryClient) -> None:
        self.sync = sync
        self.client = client  # the same as ``sync``'s: the operation log, the faults, the change streams

    name = property(lambda self: self.sync.name)
    full_name = property(lambda self: self.sync.full_name)
    codec_options = property(lambda self: self.sync.codec_options)
    write_concern = property(lambda self: self.sync.write_concern)

    @property
    def database(self) -> MemoryDatabase:
        return MemoryDatabase(self.sync.database.name, client=self.client)

    def __getitem__(self, name: str) -> MemoryCollection:
        return MemoryCollection(self.sync[name], self.client)

    def with_options(self, **kwargs: Any) -> MemoryCollection:
        return MemoryCollection(self.sync.with_options(**kwargs), self.client)

    def _op(self, command: str, method: str, filter: Any = None, update: Any = None,
            ids: tuple[Any, ...] = ()) -> Operation:
        return Operation(command, method, self.sync.database.name, self.sync.name, filter, update, ids)

    async def _run(self, op: Operation, apply: Callable[[], T]) -> T:
        return await self.client.run(op, apply)

    def _runner(self, op: Operation) -> Runner:
        return functools.partial(self.client.run, op)

    async def insert_many(self, documents: Iterable[MutableMapping[str, Any]], ordered: bool = True,
                          **kwargs: Any) -> InsertManyResult:
        docs = list(documents)
        ids = tuple(ensure_id(d) for d in docs)
        return await self._run(self._op("insert", "insert_many", ids=ids),
                               lambda: self.sync.insert_many(docs, ordered=ordered))

    async def insert_one(self, document: MutableMapping[str, Any], **kwargs: Any) -> InsertOneResult:
        ids = (ensure_id(document),)
        return await self._run(self._op("insert", "insert_one", ids=ids), lambda: self.sync.insert_one(document))

    async def bulk_write(self, requests: Iterable[Any], ordered: bool = True, **kwargs: Any) -> BulkWriteResult:
        requests = list(requests)
        names = {type(r).__name__ for r in requests}
        command = "insert" if names == {"InsertOne"} else "delete" if names <= {"DeleteOne", "DeleteMany"} else "update"
        return await self._run(self._op(command, "bulk_write", update=requests),
                               lambda: self.sync.bulk_write(requests, ordered=ordered))

    async def update_one(self, filter: Any, update: Mapping[str, Any], upsert: bool = False,
                         **kwargs: Any) -> UpdateResult:
        return await self._run(self._op("update", "update_one", filter, update),
                               lambda: self.sync.update_one(filter, update, upsert, comment=kwargs.get("comment")))

    async def update_many(self, filter: Any, update: Mapping[str, Any], upsert: bool = False,
                          **kwargs: Any) -> UpdateResult:
        return await self._run(self._op("update", "update_many", filter, update),
                               lambda: self.sync.update_many(filter, update, upsert, comment=kwargs.get("comment")))

    async def replace_one(self, filter: Any, replacement: Mapping[str, Any], upsert: bool = False,
                          **kwargs: Any) -> UpdateResult:
        return await self._run(self._op("update", "replace_one", filter, replacement),
                               lambda: self.sync.replace_one(filter, replacement, upsert,
                                                                 comment=kwargs.get("comment")))

    async def find_one_and_update(self, filter: Any, update: Mapping[str, Any], projection: Any = None,
                                  sort: Any = None, upsert: bool = False,
                                  return_document: bool = ReturnDocument.BEFORE, **kwargs: Any) -> Any:
        return await self._run(self._op("findAndModify", "find_one_and_update", filter, update),
                               lambda: self.sync.find_one_and_update(filter, update, projection, sort, upsert,
                                                                     return_document, comment=kwargs.get("comment")))

    async def delete_one(self, filter: Any, **kwargs: Any) -> DeleteResult:
        return await self._run(self._op("delete", "delete_one", filter),
                               lambda: self.sync.delete_one(filter, comment=kwargs.get("comment")))

    async def delete_many(self, filter: Any, **kwargs: Any) -> DeleteResult:
        return await self._run(self._op("delete", "delete_many", filter),
                               lambda: self.sync.delete_many(filter, comment=kwargs.get("comment")))

    def find(self, filter: Any = None, projection: Any = None, **kwargs: Any) -> AsyncCursor:
        return AsyncCursor(self.sync.find(filter, projection, **kwargs), self._runner(self._op("find", "find", filter)))

    async def find_one(self, filter: Any = None, projection: Any = None, **kwargs: Any) -> Any:
        return await self._run(self._op("find", "find_one", filter),
                               lambda: self.sync.find_one(filter, projection, **kwargs))

    async def count_documents(self, filter: Any, **kwargs: Any) -> int:
        return await self._run(self._op("aggregate", "count_documents", filter),
                               lambda: self.sync.count_documents(filter, comment=kwargs.get("comment")))

    async def estimated_document_count(self, **kwargs: Any) -> int:
        return await self._run(self._op("count", "estimated_document_count"),
                               self.sync.estimated_document_count)

    async def aggregate(self, pipeline: list[Mapping[str, Any]], **kwargs: Any) -> AsyncCursor:
        cursor = await self._run(self._op("aggregate", "aggregate", update=pipeline),
                                 lambda: self.sync.aggregate(pipeline, comment=kwargs.get("comment")))
        return AsyncCursor(cursor, self._runner(self._op("aggregate", "aggregate", update=pipeline)))

    async def create_index(self, keys: Any, **kwargs: Any) -> str:
        return await self._run(self._op("createIndexes", "create_index", update=keys),
                               lambda: self.sync.create_index(keys, **kwargs))

    async def index_information(self) -> dict[str, dict[str, Any]]:
        return await self._run(self._op("listIndexes", "index_information"), self.sync.index_information)

    async def drop(self, **kwargs: Any) -> None:
        await self._run(self._op("drop", "drop"), self.sync.drop)

    async def watch(self, pipeline: list[Mapping[str, Any]] | None = None, *,
                    start_at_operation_time: Timestamp | None = None, max_await_time_ms: int | None = None,
                    full_document: str | None = None, **kwargs: Any) -> ChangeStream:
        client = self.client

        def open_stream() -> ChangeStream:
            if not client.change_streams:
                raise OperationFailure("The $changeStream stage is only supported on replica sets", 40573)
            return ChangeStream(client.streams, self.sync.database.name, self.sync.name, list(pipeline or []),
                                (max_await_time_ms or 1000) / 1000, start_at_operation_time,
                                lookup=full_document == "updateLookup")

        return await self._run(self._op("aggregate", "watch", update=pipeline), open_stream)


class MemoryDatabase:
    """An in-memory database with the ``AsyncDatabase`` methods bucketq uses; ``db[name]`` (or ``db.name``)
    is a ``MemoryCollection``. ``MemoryDatabase("shop")`` makes a client of its own; databases of one
    ``MemoryClient`` share its data, operation log and faults.

    ``operations`` records every operation; ``faults`` injects lost replies, refusals and delays;
    ``sync`` is a synchronous view of the same data for tests to seed and inspect (not recorded)."""

    def __init__(self, name: str = DEFAULT_DB, *, client: MemoryClient | None = None,
                 codec_options: CodecOptions | None = None, write_concern: WriteConcern | None = None) -> None:
        self.client = client or MemoryClient()
        self.sync = SyncDatabase(self.client, name, codec_options or self.client.codec_options,
                                 write_concern or WriteConcern())

    name = property(lambda self: self.sync.name)
    codec_options = property(lambda self: self.sync.codec_options)
    write_concern = property(lambda self: self.sync.write_concern)
    operations = property(lambda self: self.client.operations,
                          doc="Every operation run on the client's databases, in order (an ``OperationLog``).")
    faults = property(lambda self: self.client.faults,
                      doc="The faults to inject: ``lose_reply``, ``refuse``, ``delay`` (a ``Faults``).")

    def __getitem__(self, name: str) -> MemoryCollection:
        return MemoryCollection(self.sync[name], self.client)

    def __getattr__(self, name: str) -> MemoryCollection:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def get_collection(self, name: str, **kwargs: Any) -> MemoryCollection:
        return MemoryCollection(self.sync.get_collection(name, **kwargs), self.client)

    def with_options(self, codec_options: CodecOptions | None = None, write_concern: WriteConcern | None = None,
                     **ignored: Any) -> MemoryDatabase:
        return MemoryDatabase(self.name, client=self.client, codec_options=codec_options or self.codec_options,
                              write_concern=write_concern or self.write_concern)

    async def command(self, command: str | Mapping[str, Any], value: Any = 1, **kwargs: Any) -> dict[str, Any]:
        name = command if isinstance(command, str) else next(iter(command))
        return await self.client.run(Operation(name, "command", self.name), lambda: self.sync.command(command))

    async def list_collection_names(self, **kwargs: Any) -> list[str]:
        return await self.client.run(Operation("listCollections", "list_collection_names", self.name),
                                     self.sync.list_collection_names)

    async def list_collections(self, **kwargs: Any) -> AsyncCursor:
        op = Operation("listCollections", "list_collections", self.name)
        return AsyncCursor(await self.client.run(op, self.sync.list_collections),
                           functools.partial(self.client.run, op))

    async def drop_collection(self, name: str, **kwargs: Any) -> None:
        await self.client.run(Operation("drop", "drop_collection", self.name, name),
                              lambda: self.sync.drop_collection(name))


class MemoryClient:
    """The data of any number of in-memory databases, their operation log and their faults.

    ``change_streams=False`` makes ``watch`` fail as on a standalone server (bucketq then polls);
    ``latency`` is how long each operation takes (default 0: one turn of the event loop); ``notablescan=True``
    refuses, as MongoDB's server parameter of that name does, every query that no index of its collection serves
    (``bucketq.memory.planner``)."""

    def __init__(self, *, change_streams: bool = True, latency: float = 0.0,
                 codec_options: CodecOptions | None = None, notablescan: bool = False) -> None:
        self.namespaces: dict[tuple[str, str], Namespace] = {}
        self.operations = OperationLog()
        self.faults = Faults()
        self.streams = Streams()
        self.change_streams = change_streams
        self.latency = latency
        self.codec_options = codec_options or CodecOptions()
        self.notablescan = notablescan
        self.receiving = False

    def __getitem__(self, name: str) -> MemoryDatabase:
        return MemoryDatabase(name, client=self)

    def get_database(self, name: str | None = None, **kwargs: Any) -> MemoryDatabase:
        return MemoryDatabase(name or DEFAULT_DB, client=self, **kwargs)

    @property
    def admin(self) -> MemoryDatabase:
        """The ``admin`` database, as pymongo's client has it."""
        return self["admin"]

    async def drop_database(self, name: str) -> None:
        for key in [k for k in self.namespaces if k[0] == name]:
            del self.namespaces[key]

    async def close(self) -> None:
        for stream in list(self.streams.open):
            await stream.close()

    def _received(self, apply: Callable[[], T]) -> T:
        """Apply an operation a client sent (not the ``sync`` view's seeding and inspection): the only ones
        ``notablescan`` checks. ``apply`` runs at once, without yielding, so no other operation interleaves."""
        self.receiving = True
        try:
            return apply()
        finally:
            self.receiving = False

    async def run(self, op: Operation, apply: Callable[[], T]) -> T:
        """Run one operation as a server would receive it: recorded, faults applied, with a turn of the event
        loop (or ``latency``) before it is applied."""
        fault = self.faults.take(op)
        self.operations.append(op if fault is None else replace(op, fault=fault.action))
        await asyncio.sleep(self.latency)
        if fault is not None and fault.action == "delay":
            if fault.until is not None:
                await fault.until.wait()
            else:
                await asyncio.sleep(fault.seconds)
        elif fault is not None and fault.action == "refuse":
            if fault.error is not None:
                raise copy.copy(fault.error)
            raise AutoReconnect(f"connection closed (injected by bucketq.memory: the {op.command} request on "
                                f"{op.collection} was lost)")
        if fault is None or fault.action != "lose_reply":
            return self._received(apply)
        with contextlib.suppress(Exception):  # an error is lost with the reply
            self._received(apply)
        raise AutoReconnect(f"connection closed (injected by bucketq.memory: the reply to {op.command} on "
                            f"{op.collection} was lost)")

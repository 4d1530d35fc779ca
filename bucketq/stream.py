"""``Stream``: an append-only log of bucket documents read by named reader groups (docs/FORMAT.md, Streams).

    async with bucketq.Stream("mongodb://localhost:27017", name="events") as stream:
        await stream.push({"order": 1})                  # Position(seq, slot) once stored
        async with stream.reader("audit", start="beginning") as reader:
            msg = await reader.read(timeout=5)
            await msg.ack()                              # the group's committed position moves past it

Pushes go through the queue's producer (group commit, backpressure, retries); the stream's ``StreamStore``
gives each written bucket its sequence. Nothing is deleted on ack: retention deletes the oldest buckets.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pymongo import ReturnDocument

from bucketq.clock import ServerClock
from bucketq.codecs import Codec, codec_option
from bucketq.connection import connect
from bucketq.core import stream as core
from bucketq.core.format import CLAIMS_SUFFIX, MAX_BUCKET_SIZE, POSITIONS_SUFFIX, SEQ_SUFFIX
from bucketq.core.scans import SCAN
from bucketq.core.stream import GroupState, Position, RetentionCut
from bucketq.errors import InvalidOption, QueueClosed
from bucketq.options import StreamOptions, check_database, check_names
from bucketq.producer import Outgoing, Producer
from bucketq.setup import SetUp, every, stop
from bucketq.store import Store
from bucketq.stream_reader import StreamReader

HOUSEKEEPING_EVERY_S = 60.0
ALLOCATION_ATTEMPTS = 5
log = logging.getLogger("bucketq")


class StreamStore(Store):
    """The stream's collections: ``S`` (buckets and gap markers), ``S.positions`` (the groups), ``S.claims``,
    ``S.seq``. As the producer's store it gives each bucket the producer writes its sequence (``insert_new``)."""

    def __init__(self, database: Any, name: str, *, write_concern: int | str | None, op_timeout_s: float) -> None:
        super().__init__(database, name, write_concern=write_concern, op_timeout_s=op_timeout_s)
        options = {"codec_options": self.buckets.codec_options, "write_concern": self.buckets.write_concern}
        self.positions = database[name + POSITIONS_SUFFIX].with_options(**options)
        self.claims = database[name + CLAIMS_SUFFIX].with_options(**options)
        self.counter = database[name + SEQ_SUFFIX].with_options(**options)
        self._allocating = asyncio.Lock()

    async def ensure_indexes(self) -> None:
        await self.buckets.create_index("created")  # reset(at=...)
        await self.claims.create_index([("g", 1), ("e", 1), ("s", 1)])

    async def counter_state(self) -> tuple[int, int]:
        """(last sequence allocated, retention floor): 0 and the first sequence before any write."""
        doc = await self.counter.find_one({"_id": core.COUNTER_ID}) or {}
        return int(doc.get("last", 0)), int(doc.get("floor", core.FIRST_SEQUENCE))

    async def insert_new(self, collection: Any, docs: list[dict], **_: Any) -> dict[Any, BaseException]:
        """Insert the producer's sealed buckets as stream buckets. The first attempt allocates their sequences
        (one ``$inc`` for the whole write) and sets them as the sealed documents' ``_id``, so that the pushes
        resolve to ``"<sequence>:<slot>"``; a retry keeps them. A duplicate counts as stored only if it is this
        producer's own bucket (``b``); a gap marker there fails the bucket for good. Another producer's bucket
        there means the counter handed one sequence out twice, which MongoDB's atomic ``$inc`` never does
        (mongo-java-server's findAndModify does, under concurrent requests): the bucket gets a new sequence."""
        await self._allocate([d for d in docs if "b" not in d])
        for _attempt in range(ALLOCATION_ATTEMPTS):
            failed = await super().insert_new(self.buckets, [core.stream_bucket(d) for d in docs],
                                              duplicate_is_mine=self._is_mine)
            taken = [d for d in docs if d["_id"] in failed
                     and await self.buckets.find_one({"_id": d["_id"], "gap": {"$ne": True}}, {"_id": 1})]
            if not taken:
                return failed
            for doc in taken:
                doc["_id"] = doc.pop("b")
            await self._allocate(taken)
        return failed

    async def _allocate(self, fresh: list[dict]) -> None:
        """Give each sealed bucket its sequence, one write's buckets at once, in the order sealed."""
        if not fresh:
            return
        query, update = core.allocate(len(fresh))
        async with self._allocating:  # writers allocate in the order they start: a producer's order is kept
            counter = await self.counter.find_one_and_update(query, update, upsert=True,
                                                             return_document=ReturnDocument.AFTER)
        first = counter["last"] - len(fresh) + 1
        for offset, doc in enumerate(fresh):
            doc["b"], doc["_id"] = doc["_id"], first + offset

    async def _is_mine(self, doc: dict) -> bool:
        return await self.buckets.find_one(core.own_bucket(doc["_id"], doc["b"]), {"_id": 1}) is not None


class Stream:
    """A stream stored as bucket documents in the collection ``name``, read by named groups.

    ``target``, ``db`` and ``codec`` as for ``Queue``; other keywords are ``StreamOptions``. A stream's name
    follows a queue's naming rules and must not be a queue's name.
    """

    def __init__(self, target: Any, *, name: str, db: str | None = None, codec: str | Codec = "json",
                 **options: Any) -> None:
        check_names(name, db)
        self.options = StreamOptions.from_keywords(options)
        self.codec = codec_option(codec)
        self.name = name
        self._connection = connect(target, db)
        shared = self.options.queue
        check_database(self._connection.database, name, shared.write_concern)
        self.store = StreamStore(self._connection.database, name, write_concern=shared.write_concern,
                                 op_timeout_s=shared.write_timeout)
        self.clock = ServerClock()
        self._producer = Producer(self.store, self.codec, shared, self.clock,
                                  before_write=self.ready)
        self._readers: set[StreamReader] = set()
        self._setup = SetUp(self._connection, self.clock, self.store.ensure_indexes, shared.write_timeout)
        self._housekeeping: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def database(self) -> Any:
        return self._connection.database

    async def ready(self, *, write: bool = True) -> None:
        """Set up before use (``bucketq.setup``); before the first write also start housekeeping (retention,
        old claims)."""
        if self._closed:
            raise QueueClosed("the stream is closed")
        await self._setup.ready(write=write)
        if write and self._housekeeping is None:
            self._housekeeping = asyncio.get_running_loop().create_task(
                every(HOUSEKEEPING_EVERY_S, self.apply_retention, "stream retention"), name="bucketq-retention")

    # -- producing -----------------------------------------------------------------------------------------

    async def push(self, payload: Any, *, headers: Mapping[str, Any] | None = None,
                   key: str | None = None) -> Position:
        """Append a message; return its position once the bucket holding it is stored. Raises ``WriteFailed``
        when it was not stored (its bucket's sequence may then be a gap for good)."""
        await self.ready()
        return Position.parse(await self._producer.push(payload, headers=headers, key=key))

    def push_nowait(self, payload: Any, *, headers: Mapping[str, Any] | None = None,
                    key: str | None = None) -> asyncio.Future[str]:
        """Buffer a message and return a future of its position as text, ``"<sequence>:<slot>"``
        (``Position.parse`` makes it a ``Position``), for callers who pipeline: no wrapper per message. Raises
        ``BufferFull`` instead of waiting when ``max_buffered_bytes`` is reached. Set up first (one ``push``, or
        ``await stream.ready()``) or the first write does it."""
        return self._producer.push_nowait(payload, headers=headers, key=key)

    async def push_many(self, payloads: Iterable[Any], *, headers: Mapping[str, Any] | None = None) -> list[Position]:
        """Append every payload (an ``Outgoing`` item may carry its own ``key`` and ``headers``, no delay),
        in order; return their positions."""
        items = list(payloads)
        for index, item in enumerate(items):
            if isinstance(item, Outgoing) and (item.delay is not None or item.at is not None):
                raise InvalidOption(f"payload {index}: a stream has no delayed messages (delay/at)")
        await self.ready()
        return [Position.parse(p) for p in await self._producer.push_many(items, headers=headers)]

    async def flush(self) -> None:
        """Write every open bucket now and wait for all writes."""
        await self._producer.flush()

    # -- reading -------------------------------------------------------------------------------------------

    def reader(self, group: str, *, start: str | Position | dt.datetime = "end") -> StreamReader:
        """A reader in ``group``; the readers of one group (in any process) share its messages, each read by
        one of them. ``start`` applies only when the group does not exist yet: "beginning" (the oldest
        message retained), "end" (the next message pushed), a position, or a time (as ``reset(at=)``)."""
        reader = StreamReader(self, core.check_group_name(group), start)
        self._readers.add(reader)
        return reader

    async def start_position(self, start: str | Position | dt.datetime) -> Position:
        """The position that ``start`` names: see ``reader``."""
        last, floor = await self.store.counter_state()
        if isinstance(start, dt.datetime):
            if start.tzinfo is None:
                raise InvalidOption("at must be a timezone-aware datetime")
            first = await self.store.buckets.find_one({"created": {"$gte": start}, "gap": {"$ne": True}},
                                                      {"_id": 1}, sort=[("_id", 1)])
            return Position(max(floor, first["_id"] if first else last + 1))
        if start == "beginning":
            return Position(floor)
        if start == "end":
            return Position(last + 1)
        if isinstance(start, str) and ":" not in start:
            raise InvalidOption(f"start must be 'beginning', 'end', a position or a datetime, got {start!r}")
        position = Position.parse(start)
        return position if position.seq >= floor else Position(floor)

    async def reset(self, group: str, to: str | Position | None = None, *, at: dt.datetime | None = None) -> Position:
        """Move ``group`` (created if missing) to ``to`` ("beginning", "end" or a position) or to the first
        message pushed at or after ``at``; return its new committed position. Its readers drop what they hold
        and read on from there: messages before it are skipped, messages after it read again (replay)."""
        if (to is None) == (at is None):
            raise InvalidOption("reset takes a position ('beginning', 'end', a Position) or at=, one of them")
        await self.ready()
        start = await self.start_position(at if at is not None else to)  # type: ignore[arg-type]
        await self.store.positions.update_one({"_id": core.check_group_name(group)},
                                           core.reset_update(start, self.clock.now()), upsert=True)
        return start

    async def groups(self) -> list[GroupState]:
        """Every reader group of the stream, by name."""
        await self.ready(write=False)
        cursor = self.store.positions.find({}, sort=[("_id", 1)])
        return [GroupState.parse(doc) async for doc in cursor]

    async def delete_group(self, group: str) -> bool:
        """Forget a group and its claims; True if it existed."""
        await self.ready(write=False)
        await self.store.claims.delete_many({"g": group})
        return (await self.store.positions.delete_one({"_id": group})).deleted_count == 1

    async def stats(self) -> dict[str, Any]:
        """``last_sequence`` (sequence of the last bucket allocated), ``floor`` (the oldest sequence retention
        keeps), ``buckets``, and per group in ``groups``: ``position`` (committed), ``lag_messages``, ``lag_s``
        (age of the oldest message it has not read and acked) and ``expired`` (messages retention deleted
        before the group read them). Writes nothing."""
        await self.ready(write=False)
        now = self.clock.now()
        last, floor = await self.store.counter_state()
        groups = {}
        for group in await self.groups():
            buckets = self.store.buckets.find({"_id": {"$gte": group.committed.seq}}, {"n": 1, "created": 1, "gap": 1})
            claims = self.store.claims.find({"g": group.name, "e": group.epoch, "s": {"$gte": group.committed.seq}},
                                            {"s": 1, "fin": 1, "done": 1})
            settled = {c["s"]: (MAX_BUCKET_SIZE if c.get("fin") else len(c.get("done", []))) async for c in claims}
            groups[group.name] = core.lag(group, [d async for d in buckets], settled, now)
        return {"last_sequence": last, "floor": floor, "buckets": await self.store.buckets.count_documents({}, **SCAN),
                "groups": groups}

    # -- retention -----------------------------------------------------------------------------------------

    async def apply_retention(self) -> dict[str, int]:
        """Delete the buckets beyond the retention options now: ``{"floor": ..., "deleted": ...}`` (documents
        deleted: buckets, and gap markers once ``tombstone_retention`` old). A group whose committed position is
        below the new floor jumps to it and counts the messages it lost in ``expired``. Also deletes the claims
        behind each group's committed position."""
        await self.ready()
        o = self.options
        cut = RetentionCut(self.clock.now(), o.retention_age, o.retention_messages, o.retention_bytes)
        if o.retains:
            async for doc in self.store.buckets.find({}, {"created": 1, "n": 1, "bytes": 1}, sort=[("_id", -1)]):
                if not cut.take(doc["_id"], doc["created"], doc.get("n", 0), doc.get("bytes", 0)):
                    break
        if cut.floor is not None:
            await self.store.counter.update_one(*core.raise_floor(cut.floor))
            for group in await self.groups():
                await self.expire_group(group, cut.floor)
        floor = (await self.store.counter_state())[1]
        gone = core.retired(floor, self.clock.now(), self.options.queue.tombstone_retention)
        deleted = (await self.store.buckets.delete_many(gone)).deleted_count
        for group in await self.groups():
            await self.store.claims.delete_many(core.claims_behind(group))
        return {"floor": floor, "deleted": deleted}

    async def expire_group(self, group: GroupState, floor: int) -> None:
        """Move a group left below the retention floor up to it, counting what it lost (read before deletion:
        once deleted, it would count as 0)."""
        if group.committed.seq >= floor:
            return
        unread = self.store.buckets.find({"_id": {"$gte": group.committed.seq, "$lt": floor}, "gap": {"$ne": True}},
                                         {"n": 1})
        lost = sum([d.get("n", 0) async for d in unread]) - group.committed.slot
        await self.store.positions.update_one(*core.expire_update(group, floor, max(0, lost), self.clock.now()))

    # -- shutting down -------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Stop taking pushes and write everything buffered; close the readers (their acks written)."""
        await self._producer.drain()
        await self._close_readers()

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await self.drain()
        finally:
            self._closed = True
            await stop(self._housekeeping)
            await self._connection.close()

    async def _close_readers(self) -> None:
        readers, self._readers = self._readers, set()
        await asyncio.gather(*(r.close() for r in readers), return_exceptions=True)

    def forget(self, reader: StreamReader) -> None:
        self._readers.discard(reader)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


"""``Stream``: an append-only log of bucket documents read by named reader groups (docs/FORMAT.md, Streams).

    async with bucketq.Stream("mongodb://localhost:27017", name="events") as stream:
        await stream.push({"order": 1})                  # Position(seq, slot) once stored
        async with stream.reader("audit", start="beginning") as reader:
            msg = await reader.read(timeout=5)
            await msg.ack()                              # the group's committed position moves past it

Pushes go through the queue's producer (group commit, backpressure, retries); the stream's ``AsyncStreamStore``
gives each written bucket its sequence. Nothing is deleted on ack: retention deletes the oldest buckets.

With ``partitions=N`` (N > 1) the stream is N independent sequences (docs/FORMAT.md, Partitions): each write's
buckets go to the next partition in turn, a group commits one position per partition, retention applies to each
partition, and order holds within a partition only.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from bucketq.codecs import Codec, codec_option
from bucketq.core import reader_groups
from bucketq.core.format import MAX_BUCKET_SIZE
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition, Position
from bucketq.core.stream_retention import RetentionCut
from bucketq.core.stream_stats import Lag
from bucketq.errors import InvalidOption
from bucketq.options import StreamOptions, check_database, check_names
from bucketq.shell.clock import ServerClock
from bucketq.shell.collection_setup import SetUp
from bucketq.shell.connection import connect
from bucketq.shell.lifecycle import Lifecycle
from bucketq.shell.producer import Outgoing, Producer
from bucketq.shell.stream_reader import StreamReader
from bucketq.store.aio.stream_store import AsyncStreamStore

HOUSEKEEPING_EVERY_S = 60.0
log = logging.getLogger("bucketq")


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
        self.store = AsyncStreamStore(self._connection.database, name, write_concern=shared.write_concern,
                                      op_timeout_s=shared.write_timeout, partitions=self.options.partitions)
        self.clock = ServerClock()
        self._producer = Producer(self.store, self.codec, shared, self.clock,
                                  before_write=self.ready)
        self._readers: set[StreamReader] = set()
        self._life = Lifecycle("stream", SetUp(self._connection, self.clock, self.store.ensure_indexes,
                                               shared.write_timeout))

    @property
    def database(self) -> Any:
        """The database the stream's collections live in."""
        return self._connection.database

    async def ready(self, *, write: bool = True) -> None:
        """Set up before use (``shell.collection_setup``); before the first write also start housekeeping (retention,
        old claims)."""
        await self._life.ready(write=write)
        await self.store.open()
        if write:
            self._life.keep_house(HOUSEKEEPING_EVERY_S, self.apply_retention, "stream retention", "bucketq-retention")

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
        reader = StreamReader(self, reader_groups.check_name(group), start)
        self._readers.add(reader)
        return reader

    async def start_positions(self, start: str | Position | Iterable[Position] | dt.datetime,
                              current: ReaderGroup | None = None) -> list[Position]:
        """The positions, one per partition, that ``start`` names (see ``reader``): positions name their own
        partitions; the others stay at ``current``'s, or at the end for a new group."""
        counters = await self.store.counters()
        parts = await self.store.open()
        if isinstance(start, dt.datetime):
            if start.tzinfo is None:
                raise InvalidOption("at must be a timezone-aware datetime")
            firsts = [await self.store.first_pushed_at(part, start) for part in parts]
            return [Position(max(counters[p.number][1], first if first is not None else counters[p.number][0] + 1),
                             0, p.number) for p, first in zip(parts, firsts, strict=True)]
        if start in ("beginning", "end"):
            return [Position(floor if start == "beginning" else last + 1, 0, pt)
                    for pt, (last, floor) in counters.items()]
        if isinstance(start, str) and ":" not in start:
            raise InvalidOption(f"start must be 'beginning', 'end', a position or a datetime, got {start!r}")
        named = [Position.parse(start)] if isinstance(start, (str, Position)) else [Position.parse(p) for p in start]
        out = list(current.positions) if current is not None else await self.start_positions("end")
        for position in named:
            if position.partition >= len(parts):
                raise InvalidOption(f"position {position} names partition {position.partition}; the stream has "
                                    f"{len(parts)}")
            out[position.partition] = max(position, Position(counters[position.partition][1], 0, position.partition))
        return out

    async def reset(self, group: str, to: str | Position | Iterable[Position] | None = None, *,
                    at: dt.datetime | None = None) -> Position | list[Position]:
        """Move ``group`` (created if missing) to ``to`` ("beginning", "end", a position, or in a partitioned
        stream positions of some partitions: the others stay) or to the first message pushed at or after ``at``;
        return its new committed position (one per partition, a list, in a partitioned stream). Its readers drop
        what they hold and read on from there: messages before it are skipped, messages after it read again
        (replay). A reset is a new epoch of the whole group: what its readers held in any partition is read
        again from their written acks."""
        if (to is None) == (at is None):
            raise InvalidOption("reset takes a position ('beginning', 'end', a Position) or at=, one of them")
        await self.ready()
        name = reader_groups.check_name(group)
        start = await self.start_positions(at if at is not None else to,  # type: ignore[arg-type]
                                           await self.store.group(name))
        await self.store.reset_group(name, start, self.clock.now())
        for reader in self._readers:  # the group's readers in this process read from the new position at once
            reader.notify()
        return start[0] if len(start) == 1 else start

    async def groups(self) -> list[ReaderGroup]:
        """Every reader group of the stream, by name."""
        await self.ready(write=False)
        return await self.store.groups()

    async def delete_group(self, group: str) -> bool:
        """Forget a group and its claims; True if it existed."""
        await self.ready(write=False)
        return await self.store.delete_group(group)

    async def stats(self) -> dict[str, Any]:
        """``last_sequence`` (sequence of the last bucket allocated), ``floor`` (the oldest sequence retention
        keeps) (in a partitioned stream: lists, by partition), ``buckets``, and per group in ``groups``:
        ``position`` (committed; in a partitioned stream one per partition, separated by spaces),
        ``lag_messages``, ``lag_s`` (age of the oldest message it has not read and acked) and ``expired``
        (messages retention deleted before the group read them). Writes nothing."""
        await self.ready(write=False)
        now = self.clock.now()
        counters = await self.store.counters()
        groups = {}
        for group in await self.groups():
            lag = Lag()
            for part in self.store.parts:
                committed = group.at(part)
                buckets = await self.store.buckets_from(part, committed.seq)
                claims = await self.store.claim_progress(group, part, committed.seq)
                lag.add(part, committed, buckets,
                        {c["s"]: (MAX_BUCKET_SIZE if c.get("fin") else len(c.get("done", []))) for c in claims})
            groups[group.name] = lag.report(group, self.store.parts, now)
        lasts, floors = [c[0] for c in counters.values()], [c[1] for c in counters.values()]
        single = len(lasts) == 1
        return {"last_sequence": lasts[0] if single else lasts, "floor": floors[0] if single else floors,
                "buckets": await self.store.count_buckets(), "groups": groups}

    # -- retention -----------------------------------------------------------------------------------------

    async def apply_retention(self) -> dict[str, int]:
        """Delete the buckets beyond the retention options now: ``{"floor": ..., "deleted": ...}`` (documents
        deleted: buckets, and gap markers once ``tombstone_retention`` old). A group whose committed position is
        below the new floor jumps to it and counts the messages it lost in ``expired``. Also deletes the claims
        behind each group's committed position. In a partitioned stream the limits apply to each partition,
        and ``floor`` is a list, by partition."""
        await self.ready()
        floors, deleted = [], 0
        for part in self.store.parts:
            floor, gone = await self._retain(part)
            floors.append(floor)
            deleted += gone
        for group in await self.groups():
            await self.store.delete_claims_behind(group)
        return {"floor": floors[0] if len(floors) == 1 else floors, "deleted": deleted}  # type: ignore[dict-item]

    async def _retain(self, part: Partition) -> tuple[int, int]:
        """Retention in one partition: its floor and the documents deleted."""
        o = self.options
        cut = RetentionCut(self.clock.now(), o.retention_age, o.retention_messages, o.retention_bytes)
        if o.retains:
            async for doc in self.store.newest_first(part):
                if not cut.take(part.seq_of(doc), doc["created"], doc.get("n", 0), doc.get("bytes", 0)):
                    break
        if cut.floor is not None:
            await self.store.raise_floor(part, cut.floor)
            for group in await self.groups():
                await self.expire_group(group, part, cut.floor)
        floor = (await self.store.counter_state(part))[1]
        return floor, await self.store.delete_retired(part, floor, self.clock.now(),
                                                      self.options.queue.tombstone_retention)

    async def expire_group(self, group: ReaderGroup, part: Partition, floor: int) -> None:
        """Move a group left below the retention floor of ``part`` up to it, counting what it lost (read before
        deletion: once deleted, it would count as 0)."""
        committed = group.at(part)
        if committed.seq >= floor:
            return
        lost = await self.store.unread_messages(part, committed.seq, floor) - committed.slot
        await self.store.expire_group(group, part, floor, max(0, lost), self.clock.now())

    # -- shutting down -------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Stop taking pushes and write everything buffered; close the readers (their acks written)."""
        await self._producer.drain()
        await self._close_readers()

    async def close(self) -> None:
        """Drain (see ``drain``), then stop the stream's tasks and close the connection it opened. Leaving
        ``async with`` calls it."""
        await self._life.close(self.drain, self._connection.close)

    async def _close_readers(self) -> None:
        readers, self._readers = self._readers, set()
        await asyncio.gather(*(r.close() for r in readers), return_exceptions=True)

    def forget(self, reader: StreamReader) -> None:
        """``reader`` closed: the others look again (it handed its buckets back)."""
        self._readers.discard(reader)
        for other in self._readers:
            other.notify()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


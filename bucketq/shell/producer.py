"""The write path: buffered pushes become bucket documents, each push resolved once its bucket is stored.

Runs the sans-I/O ``Accumulator`` and carries out its group-commit decisions on the event loop: it asks which
buckets to write once each burst of pushes is buffered, whenever a write ends, and at the ``bucket_max_wait``
deadline (a timer); it shares the buckets to write among up to ``max_in_flight_writes`` concurrent writers, an
insert each, and applies backpressure on ``max_buffered_bytes``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from itertools import repeat
from typing import Any, cast

from bucketq import metrics
from bucketq.codecs import Codec
from bucketq.core.accumulator import Accumulator, SealedBucket, Waiter
from bucketq.core.format import (
    DOCUMENT_CODEC,
    PLAIN_SLOT_BYTES,
    AnySlot,
    PlainSlot,
    check_group,
    encode_slot,
)
from bucketq.core.priorities import MAX_PRIORITY, check_priority
from bucketq.core.sharding import Spread
from bucketq.errors import BufferFull, EncodeError, InvalidOption, PayloadTooLarge, QueueClosed
from bucketq.options import QueueOptions, check_delay
from bucketq.shell.clock import ServerClock
from bucketq.shell.unique import hold_keys, unique_until
from bucketq.store.aio.base import retrying
from bucketq.store.aio.queue_store import AsyncQueueStore
from bucketq.store.aio.stream_store import AsyncStreamStore

BUCKETS_PER_WRITE = 8
_DUE_NOW = (None, 0)  # push_many's route of a message due now: no group, level 0
UNIQUE_SLOT_BYTES = 16  # a date in the bucket's ``u`` array (unique jobs)


class Outgoing:
    """One message of ``push_many`` with options of its own, as ``push`` takes them:
    ``await q.push_many([Outgoing(order, key=order["id"]), Outgoing(reminder, delay=3600), plain_payload])``.
    Not a payload itself: no codec encodes it, so passing one to ``push`` fails instead of storing its fields."""

    __slots__ = ("payload", "key", "delay", "at", "headers", "group", "priority", "unique_for")

    def __init__(self, payload: Any, *, key: str | None = None, delay: float | dt.timedelta | None = None,
                 at: dt.datetime | None = None, headers: Mapping[str, Any] | None = None,
                 group: str | None = None, priority: int | None = None,
                 unique_for: float | dt.timedelta | None = None) -> None:
        self.payload = payload
        self.key = key
        self.delay = delay
        self.at = at
        self.headers = headers
        self.group = group
        self.priority = priority  # None: the priority of the push_many call
        self.unique_for = unique_for

    def __repr__(self) -> str:
        options = "".join(f", {name}={getattr(self, name)!r}" for name in self.__slots__[1:]
                          if getattr(self, name) is not None)
        return f"Outgoing({self.payload!r:.60}{options})"


class _Many:
    """What one ``push_many`` call awaits: one future for all its messages, not one each (``_Run``)."""

    __slots__ = ("ids", "left", "future")

    def __init__(self, n: int) -> None:
        self.ids = [""] * n
        self.left = n
        self.future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()


class _Run:
    """The waiter of a run of a ``push_many`` call's messages that went one after another into one bucket (messages
    ``first``, ``first + 1``, ... of the call): one object a bucket, not one a message. Settled by the bucket
    once for the run (``set_results``, the run added by ``Accumulator.extend``) or a slot at a time in order
    (``set_result``), each id going to the next message of the run."""

    __slots__ = ("many", "next")

    def __init__(self, many: _Many, first: int) -> None:
        self.many = many
        self.next = first

    def done(self) -> bool:
        return self.many.future.done()

    def set_result(self, message_id: str) -> None:
        many = self.many
        many.ids[self.next] = message_id
        self.next += 1
        many.left -= 1
        if not many.left:
            many.future.set_result(many.ids)

    def set_results(self, message_ids: list[str]) -> None:
        many, first = self.many, self.next
        many.ids[first:first + len(message_ids)] = message_ids
        self.next = first + len(message_ids)
        many.left -= len(message_ids)
        if not many.left:
            many.future.set_result(many.ids)

    def set_exception(self, failure: BaseException) -> None:
        self.many.future.set_exception(failure)


class PushEncoder:
    """What the async ``Producer`` and the sync one (``bucketq.sync_queue``) share: a push's arguments checked and
    its payload encoded into a slot, with its size and due time, before it is buffered."""

    _codec: Codec
    _plain_codec: bool
    _options: QueueOptions
    _clock: ServerClock
    _acc: Accumulator
    _closed: bool

    def _prepare_item(self, index: int, item: Any, delay: float | dt.timedelta | None,
                      headers: Mapping[str, Any] | None, priority: int,
                      plain_call: bool) -> tuple[AnySlot, int, dt.datetime | None, tuple[str | None, int]]:
        """``_prepare`` of ``push_many``'s item ``index`` (an ``Outgoing`` with options of its own, or a payload
        taking the call's), with its route (group, level); errors name the item."""
        try:
            if isinstance(item, Outgoing):
                timed = item.delay is not None or item.at is not None
                level = item.priority if item.priority is not None else 0 if item.group is not None else priority
                slot, size, due = self._prepare(item.payload, item.delay if timed else delay, item.at,
                                                headers if item.headers is None else item.headers, item.key,
                                                item.group, level, item.unique_for)
                return slot, size, due, (item.group, level)
            if plain_call and (plain := self._plain_slot(item)) is not None:
                return *plain, None, _DUE_NOW
            slot, size, due = self._prepare(item, delay, None, headers, None, None, priority)
            return slot, size, due, (None, priority)
        except (EncodeError, PayloadTooLarge, InvalidOption) as exc:
            raise type(exc)(f"payload {index}: {exc}") from exc

    def _prepare(self, payload: Any, delay: float | dt.timedelta | None, at: dt.datetime | None,
                 headers: Mapping[str, Any] | None, key: str | None, group: str | None = None, priority: int = 0,
                 unique_for: float | dt.timedelta | None = None) -> tuple[AnySlot, int, dt.datetime | None]:
        if self._closed:
            raise QueueClosed("the queue was drained or closed; it takes no more pushes")
        # an int in range passes at the cost of a comparison (every push comes here); the rest is checked in full
        if priority.__class__ is not int or not 0 <= priority <= MAX_PRIORITY:
            check_priority(priority)  # raises, or takes an int subclass
        if group is None and delay is None and at is None and headers is None and key is None and unique_for is None \
                and (plain := self._plain_slot(payload)) is not None:
            return *plain, None
        if group is not None:
            check_group(group)
            if delay is not None or at is not None:
                raise InvalidOption("a grouped message takes no delay or at: it would hold back its whole group")
            if priority:
                raise InvalidOption("a grouped message takes no priority: its group's order comes first")
        slot, size = encode_slot(self._codec, payload, headers, key)
        if unique_for is not None:
            slot = slot._replace(unique=unique_until(unique_for, key, self._clock.now()))
            size += UNIQUE_SLOT_BYTES
        if size > self._acc.max_slot_bytes:
            raise PayloadTooLarge(f"encoded payload takes {size} bytes; a bucket holds at most "
                                  f"{self._options.bucket_max_bytes} (bucket_max_bytes)")
        return slot, size, None if delay is None and at is None else self._due(delay, at)

    def _plain_slot(self, payload: Any) -> tuple[PlainSlot, int] | None:
        """The slot and size of a push with no option whose payload the codec makes text or binary that a bucket
        takes, built here rather than by ``encode_slot`` and ``slot_bytes`` (two calls, a fifth of a push's own
        work). None for anything else (a document, text that is no UTF-8), and for a payload the codec refuses: the
        general way then raises the right error. A codec that stores documents is not asked: the general way encodes
        its payload, once."""
        if not self._plain_codec:
            return None
        try:
            stored = self._codec.dump(payload)
        except Exception:
            return None
        size = len(stored) if type(stored) is str and stored.isascii() else _stored_bytes(stored)
        if size is not None and (size := size + PLAIN_SLOT_BYTES) <= self._acc.max_slot_bytes:
            return stored, size
        return None

    def _due(self, delay: float | dt.timedelta | None, at: dt.datetime | None) -> dt.datetime | None:
        if delay is not None and at is not None:
            raise InvalidOption("give delay or at, not both")
        if at is not None:
            if not isinstance(at, dt.datetime) or at.tzinfo is None:
                raise InvalidOption("at must be a timezone-aware datetime")
            return at
        if delay is None:
            return None
        seconds = check_delay(delay)
        return self._clock.now() + dt.timedelta(seconds=seconds) if seconds else None


class Producer(PushEncoder):
    def __init__(self, store: AsyncQueueStore | AsyncStreamStore, codec: Codec, options: QueueOptions,
                 clock: ServerClock, on_written: Callable[[], None] | None = None,
                 before_write: Callable[[], Awaitable[None]] | None = None, mark_checked: bool = False) -> None:
        """``mark_checked``: mark the buckets written as checked (``format.CHECKED``) when the codec checks what it
        dumps (``checks_on_dump``): a queue's producer; a stream's buckets have no such field."""
        self._store = store
        self._spread = Spread()  # a queue's buckets' partitions (a stream's store allocates its own, in turn)
        self._codec = codec
        self._plain_codec = codec.name != DOCUMENT_CODEC  # its payloads are text or binary: plain slots (_plain_slot)
        self._options = options
        self._clock = clock
        self._on_written = on_written
        self._before_write = before_write
        self._acc = Accumulator(max_size=options.bucket_max_size, max_bytes=options.bucket_max_bytes,
                                max_wait=options.bucket_max_wait, granularity=options.due_granularity,
                                codec=codec.name, min_wait=options.bucket_min_wait,
                                checked=mark_checked and getattr(codec, "checks_on_dump", False) is True)
        self._sealed: deque[SealedBucket] = deque()
        self._writers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._space: asyncio.Condition | None = None
        self._commit_soon = False  # a _commit is scheduled for the end of the current burst of pushes
        self._linger: asyncio.TimerHandle | None = None  # _commit at the bucket_max_wait deadline
        self._linger_at: float | None = None
        # A push's future, made on the running loop: the first push sets the producer up there (_start).
        self._new_future: Callable[[], asyncio.Future[str]] = self._first_future
        self._closed = False
        self._metrics = metrics.for_queue(store.name, store.database.name)

    @property
    def buffered_bytes(self) -> int:
        return self._acc.buffered_bytes

    # -- pushing -------------------------------------------------------------------------------------------

    def push_nowait(self, payload: Any, delay: float | dt.timedelta | None = None, at: dt.datetime | None = None,
                    headers: Mapping[str, Any] | None = None, key: str | None = None,
                    group: str | None = None, priority: int = 0,
                    unique_for: float | dt.timedelta | None = None) -> asyncio.Future[str]:
        """Buffer a message now; the future resolves to its id once stored. Raises ``BufferFull`` instead of
        waiting when ``max_buffered_bytes`` is reached."""
        if delay is None and at is None and headers is None and key is None and group is None \
                and unique_for is None and priority.__class__ is int and not priority \
                and (plain := self._push_plain(payload)) is not None:
            return plain
        slot, size, due = self._prepare(payload, delay, at, headers, key, group, priority, unique_for)
        buffered = self._acc.buffered_bytes
        if buffered and buffered + size > self._options.max_buffered_bytes:
            raise BufferFull(f"{buffered} bytes buffered (max_buffered_bytes); await push() instead")
        future: asyncio.Future[str] = self._new_future()
        self._add(slot, size, due, future, group, priority)
        return future

    async def push(self, payload: Any, delay: float | dt.timedelta | None = None, at: dt.datetime | None = None,
                   headers: Mapping[str, Any] | None = None, key: str | None = None, group: str | None = None,
                   priority: int = 0, unique_for: float | dt.timedelta | None = None) -> str:
        if delay is None and at is None and headers is None and key is None and group is None \
                and unique_for is None and priority.__class__ is int and not priority \
                and (plain := self._push_plain(payload)) is not None:
            return await plain
        slot, size, due = self._prepare(payload, delay, at, headers, key, group, priority, unique_for)
        buffered = self._acc.buffered_bytes
        if buffered and buffered + size > self._options.max_buffered_bytes:
            await self._wait_for_space(size)
        future: asyncio.Future[str] = self._new_future()
        self._add(slot, size, due, future, group, priority)
        return await future

    async def push_many(self, payloads: Iterable[Any], *, delay: float | dt.timedelta | None = None,
                        headers: Mapping[str, Any] | None = None, priority: int = 0) -> list[str]:
        """Push every payload; all are encoded and checked first, so one bad payload or option fails the call
        before any is pushed. An item may be an ``Outgoing`` carrying options of its own (key, delay or at,
        headers, group, priority); ``delay``, ``headers`` and ``priority`` apply to the items that set none (a
        grouped item takes no delay, and no priority: level 0)."""
        items = payloads if type(payloads) is list else list(payloads)
        # a call with no option: each payload with a plain slot skips _prepare (whose checks the call has passed)
        plain_call = delay is None and headers is None and priority.__class__ is int and not priority \
            and not self._closed
        if plain_call and (batch := self._plain_slots(items)) is not None:  # the common call, in passes over it
            many = _Many(len(items))
            await self._push_run(many, *batch, 0, len(items))
            return await many.future
        slots: list[AnySlot] = []
        sizes: list[int] = []
        dues: list[dt.datetime | None] = []
        routes: list[tuple[str | None, int]] = []  # each item's group and level
        for index, item in enumerate(items):
            slot, size, due, route = self._prepare_item(index, item, delay, headers, priority, plain_call)
            slots.append(slot)
            sizes.append(size)
            dues.append(due)
            routes.append(route)
        n = len(slots)
        if not n:
            return []
        many = _Many(n)
        if dues.count(None) == n and routes.count(_DUE_NOW) == n:  # the common call: counted in C
            await self._push_run(many, slots, sizes, 0, n)
            return await many.future
        # each message due now, ungrouped and of level 0: of the open bucket of such messages, which takes runs
        now = [due is None and group is None and not level for due, (group, level) in zip(dues, routes, strict=True)]
        index = 0
        while index < n:
            if now[index]:
                end = index + 1
                while end < n and now[end]:
                    end += 1
                await self._push_run(many, slots, sizes, index, end)
                index = end
            else:
                await self._wait_for_space(sizes[index])
                self._add(slots[index], sizes[index], dues[index], _Run(many, index), *routes[index])
                index += 1
        return await many.future

    async def _push_run(self, many: _Many, slots: list[AnySlot], sizes: list[int], start: int, end: int) -> None:
        """``push_many``'s messages ``start`` to ``end`` (excluded), all due now, ungrouped and of level 0: a bucket's
        worth at a time into the open bucket of such messages (``Accumulator.extend``), one waiter a bucket, settled
        once."""
        limit, index = self._options.max_buffered_bytes, start
        while index < end:
            run = _Run(many, index)
            taken = self._acc.extend(slots, sizes, index, end, run, limit - self._acc.buffered_bytes)
            if not taken:  # no open bucket, a full one, or no room: one message the general way opens the next
                await self._wait_for_space(sizes[index])
                self._add(slots[index], sizes[index], None, run)
                taken = 1
            elif not self._commit_soon:
                self._add_done()
            index += taken

    def _plain_slots(self, items: list[Any]) -> tuple[list[AnySlot], list[int]] | None:
        """``_plain_slot`` of each of ``push_many``'s items, in passes over the list that run in C but for the
        codec's calls, instead of a call and a loop's worth of Python an item. None, having stored nothing, when
        any item is an ``Outgoing`` or has no plain slot, or when there are none: ``push_many`` then goes item by
        item, which encodes them again (the cost of a call that fails or carries options) and raises for the
        right one."""
        if not self._plain_codec or not items or any(map(isinstance, items, repeat(Outgoing))):
            return None
        dump = self._codec.dump
        try:
            stored: list[Any] = [dump(item) for item in items]  # text or binary, checked below
        except Exception:
            return None
        if set(map(type, stored)) == {str} and all(map(str.isascii, stored)):
            lengths = list(map(len, stored))
        else:
            stored_bytes = list(map(_stored_bytes, stored))
            if None in stored_bytes:
                return None
            lengths = cast(list[int], stored_bytes)
        sizes = [length + PLAIN_SLOT_BYTES for length in lengths]
        if max(sizes) > self._acc.max_slot_bytes:
            return None
        return stored, sizes

    def _push_plain(self, payload: Any) -> asyncio.Future[str] | None:
        """The common push (``push`` and ``push_nowait`` with no option, of a payload with a plain slot) into the open
        bucket of messages due now, in one pass: no ``_prepare`` and ``_add``. None, having changed nothing, for any
        other push or when the buffer is full: the caller then goes the general way (which raises ``BufferFull``, or
        waits, having encoded the payload again: a full buffer's cost only)."""
        if self._closed or (plain := self._plain_slot(payload)) is None:
            return None
        slot, size = plain
        acc = self._acc
        if acc.buffered_bytes and acc.buffered_bytes + size > self._options.max_buffered_bytes:
            return None
        future = self._new_future()
        if not acc.append(slot, size, future):
            self._add(slot, size, None, future)  # opens a bucket: once a bucket
        elif not self._commit_soon:
            self._add_done()
        return future

    def _first_future(self) -> asyncio.Future[str]:
        """``_new_future`` until the first push has set the producer up on its loop (``_start``)."""
        self._start()
        return self._new_future()

    def _add(self, slot: AnySlot, size: int, due: dt.datetime | None, waiter: Waiter, group: str | None = None,
             priority: int = 0) -> None:
        # Most pushes join the open bucket of messages due now: no clock read, nothing sealed.
        sealed = None
        if due is not None or group is not None or priority or not self._acc.append(slot, size, waiter):
            sealed = self._acc.add(slot, size, waiter, due=due, now_wall=self._clock.now(), now_mono=time.monotonic(),
                                   group=group, priority=priority)
        if sealed:  # written by the commit after this burst with the buckets the rest of it fills, shared out among
            # the free writers (_kick_writers): not an insert as each one fills
            self._sealed.extend(sealed)
        if not self._commit_soon:
            self._add_done()

    def _add_done(self) -> None:
        """Ask the accumulator what to write, not now: after the pushes already queued on the loop, so that a
        burst shares one bucket."""
        self._commit_soon = True
        if self._loop is None:
            self._start()
        assert self._loop is not None
        self._loop.call_soon(self._commit)

    async def _wait_for_space(self, size: int) -> None:
        limit = self._options.max_buffered_bytes
        if self._acc.buffered_bytes + size <= limit or not self._acc.buffered_bytes:
            return
        assert self._space is not None
        async with self._space:
            await self._space.wait_for(lambda: self._acc.buffered_bytes + size <= limit or not self._acc.buffered_bytes)

    # -- writing -------------------------------------------------------------------------------------------

    def _start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._space = asyncio.Condition()
        # asyncio's own loops make a future with a Python-level method; the C class, which binds to the running
        # loop (this one: pushes run on it), makes the same future without that call or a keyword argument to parse
        # (one a push). Other loops (uvloop) keep their own.
        plain = type(loop).create_future is asyncio.BaseEventLoop.create_future
        self._new_future = asyncio.Future if plain else loop.create_future

    def _commit(self) -> None:
        """Write what the accumulator says is due now, with the buckets sealed before it that wait for a writer, and
        keep the linger timer on its next deadline."""
        self._commit_soon = False
        self._sealed.extend(self._acc.ready(self._clock.now(), time.monotonic()))
        if self._sealed:
            self._kick_writers()
        deadline = self._acc.next_deadline()
        if deadline != self._linger_at:
            self._stop_linger()
            if deadline is not None:
                assert self._loop is not None  # _commit runs on the loop, after _start
                self._linger = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._on_linger)
                self._linger_at = deadline

    def _on_linger(self) -> None:
        self._linger = self._linger_at = None
        self._commit()

    def _stop_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
        self._linger = self._linger_at = None

    def _kick_writers(self) -> None:
        # The sealed buckets shared out evenly among the free writers: an insert a writer (each command costs the
        # client a few hundred microseconds), and the writes still stored side by side.
        while self._sealed and (free := self._options.max_in_flight_writes - len(self._writers)) > 0:
            share = min(BUCKETS_PER_WRITE, -(-len(self._sealed) // free))
            batch = [self._sealed.popleft() for _ in range(share)]
            task = asyncio.get_running_loop().create_task(self._write(batch), name="bucketq-write")
            self._writers.add(task)
            task.add_done_callback(self._writer_done)

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        self._writers.discard(task)
        self._commit()  # what filled up while this write was in flight goes now, with what waited for a writer

    async def _write(self, batch: list[SealedBucket]) -> None:
        """Insert the buckets, retrying transient errors; resolve or fail every push they hold."""
        failed: dict[Any, BaseException] = {}
        try:
            if self._before_write is not None:
                await self._before_write()
            now = self._clock.now()
            # Due by the earliest reading of the server's clock: a client whose reading is behind this one's
            # (each is known only within its error) finds the bucket due all the same.
            due = self._clock.earliest()
            for bucket in batch:
                if bucket.immediate:
                    bucket.document["due"] = due
            # unique jobs: their keys first; a message merged into another job is written done, or not at all
            docs = await hold_keys(self._store, batch, now, self._options.write_timeout)

            async def insert(retry: bool) -> dict[Any, BaseException]:
                if isinstance(self._store, AsyncQueueStore):
                    self._spread.assign(docs, await self._store.partition_count())  # a retry keeps them
                return await self._store.write_buckets(docs)

            if docs:
                failed = await retrying(insert, timeout_s=self._options.write_timeout)
        except Exception as exc:
            failed = {b.id: exc for b in batch}
        for bucket in batch:
            self._sealed.extend(self._acc.written(bucket))  # a group's next bucket, which waited for this one
        # Start the next writes before settling these pushes: a settled push's caller runs only after the new
        # writers' first steps, which send their inserts, so the server stores them while the callers push more.
        self._writers.discard(asyncio.current_task())
        self._commit()  # which kicks the writers for every sealed bucket
        for bucket in batch:
            bucket.resolve(failed.get(bucket.id))
        self._metrics.written(batch, failed, self._clock.now)
        if len(failed) < len(batch) and self._on_written is not None:
            self._on_written()
        assert self._space is not None
        async with self._space:
            self._space.notify_all()

    # -- shutting down -------------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write every open bucket now and wait until every bucket written so far is stored or failed."""
        self._sealed.extend(self._acc.seal_all(self._clock.now()))
        if self._sealed:
            self._kick_writers()
        while self._writers:
            await asyncio.gather(*list(self._writers), return_exceptions=True)

    async def drain(self) -> None:
        """Stop taking pushes, then flush everything. The linger timer stops even when the flush fails."""
        self._closed = True
        try:
            await self.flush()
        finally:
            self._stop_linger()


def _stored_bytes(stored: Any) -> int | None:
    """The bytes a codec's text (as UTF-8) or binary takes in a bucket; None for anything else (a document), and for
    text that is no UTF-8 (a lone surrogate)."""
    if type(stored) is bytes:
        return len(stored)
    if type(stored) is str:
        try:
            return len(stored.encode())
        except UnicodeEncodeError:
            return None
    return None

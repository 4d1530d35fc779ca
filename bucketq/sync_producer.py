"""``SyncProducer``: push from code without an event loop (a Django or Flask view, a management command, a
script), with the async ``Queue.push``'s buffering, durability and errors.

The same sans-I/O ``Accumulator`` as the async producer, driven by threads instead of a loop: a push encodes its
payload in the caller's thread (``PushEncoder``), buffers it under a lock and blocks until the bucket holding it
is acknowledged, or raises. Up to ``max_in_flight_writes`` daemon writer threads write what the accumulator says is
due, through the generated synchronous store (``bucketq.store.sync``): group commit as in the async producer, so
pushes from many threads made while a write is in flight share the next bucket, and a lone push costs one round
trip. A write is retried for ``write_timeout`` under the bucket's client-made ``_id``: a retry after a lost reply
stores nothing twice.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from bucketq import metrics
from bucketq.codecs import Codec, codec_option
from bucketq.core import unique
from bucketq.core.accumulator import Accumulator, SealedBucket
from bucketq.core.format import DOCUMENT_CODEC
from bucketq.core.sharding import Spread
from bucketq.errors import InvalidOption, QueueClosed
from bucketq.options import QueueOptions, check_database, check_names
from bucketq.shell.clock import ServerClock
from bucketq.shell.connection import reaching
from bucketq.shell.producer import PushEncoder
from bucketq.shell.sync_database import SyncTarget, sync_database
from bucketq.shell.unique import merge_held
from bucketq.store.sync.base import retrying
from bucketq.store.sync.queue_store import QueueStore


class SyncProducer(PushEncoder):
    """Pushes to queue ``name`` from synchronous code: ``push`` returns the message's id once the bucket holding
    it is acknowledged by the write concern, or raises (``WriteFailed`` after ``write_timeout``, ``BufferFull``
    never: it waits for room). Thread-safe: pushes from many threads share buckets.

    ``target`` is a MongoDB URI, a ``MongoClient`` or a ``Database`` (for tests also a ``bucketq.memory``
    database); ``codec`` and the options are the async ``Queue``'s (``QueueOptions``, validated here; the
    producer's are the ones used). Close it (``close``, or a ``with`` block) to write what is buffered and stop
    its threads. Pushes in a transaction (``session``) are the async ``Queue``'s."""

    def __init__(self, target: SyncTarget, *, name: str, db: str | None = None, codec: str | Codec = "json",
                 **options: Any) -> None:
        check_names(name, db)
        unknown = set(options) - set(QueueOptions.__dataclass_fields__)
        if unknown:
            raise InvalidOption(f"unknown option(s): {', '.join(sorted(unknown))}")
        self.options = self._options = QueueOptions(**options)
        self._codec = self.codec = codec_option(codec)
        self._plain_codec = self._codec.name != DOCUMENT_CODEC
        self.name = name
        self._uri = target if isinstance(target, str) else None  # shown only redacted
        database, self._owned = sync_database(target, db, "SyncProducer")
        check_database(database, name, self.options.write_concern)
        self.database = database
        self._store = QueueStore(database, name, write_concern=self.options.write_concern,
                                 op_timeout_s=self.options.write_timeout, partitions=self.options.partitions)
        self._spread = Spread()  # the partitions of the buckets it writes
        self._clock = ServerClock()
        self._indexed = False
        self._setting_up = threading.Lock()
        opts = self.options
        self._acc = Accumulator(max_size=opts.bucket_max_size, max_bytes=opts.bucket_max_bytes,
                                max_wait=opts.bucket_max_wait, granularity=opts.due_granularity,
                                codec=self._codec.name, min_wait=opts.bucket_min_wait,
                                checked=getattr(self._codec, "checks_on_dump", False) is True)
        self._changed = threading.Condition()  # guards the accumulator and what follows; told of every change
        self._sealed: deque[SealedBucket] = deque()  # to write, waiting for a writer
        self._writers: list[threading.Thread] = []
        self._closed = False
        self._metrics = metrics.for_queue(name, database.name)

    # -- pushing -------------------------------------------------------------------------------------------

    def push(self, payload: Any, *, delay: float | dt.timedelta | None = None, at: dt.datetime | None = None,
             headers: Mapping[str, Any] | None = None, key: str | None = None, group: str | None = None,
             priority: int = 0, unique_for: float | dt.timedelta | None = None) -> str:
        """Push a message; return its id once the bucket holding it is acknowledged. The arguments are the async
        ``Queue.push``'s."""
        slot, size, due = self._prepare(payload, delay, at, headers, key, group, priority, unique_for)
        self._ready()
        waiter: concurrent.futures.Future[str] = concurrent.futures.Future()
        with self._changed:
            self._wait_for_space(size)
            self._sealed.extend(self._acc.add(slot, size, waiter, due=due, now_wall=self._clock.now(),
                                              now_mono=time.monotonic(), group=group, priority=priority))
            self._buffered()
        return waiter.result()

    def push_many(self, payloads: Iterable[Any], *, delay: float | dt.timedelta | None = None,
                  headers: Mapping[str, Any] | None = None, priority: int = 0) -> list[str]:
        """Push every payload (or ``bucketq.Outgoing``) as the async ``Queue.push_many`` does: all are encoded and
        checked first, so one bad payload or option fails the call before any is pushed. Returns their ids once
        every bucket holding them is acknowledged; raises ``WriteFailed`` if any was not stored."""
        items = list(payloads)
        plain_call = delay is None and headers is None and not priority
        prepared = [self._prepare_item(i, item, delay, headers, priority, plain_call) for i, item in enumerate(items)]
        self._ready()
        waiters: list[concurrent.futures.Future[str]] = []
        with self._changed:
            for slot, size, due, (group, level) in prepared:
                self._wait_for_space(size)
                waiter: concurrent.futures.Future[str] = concurrent.futures.Future()
                self._sealed.extend(self._acc.add(slot, size, waiter, due=due, now_wall=self._clock.now(),
                                                  now_mono=time.monotonic(), group=group, priority=level))
                waiters.append(waiter)
                self._buffered()
        return [waiter.result() for waiter in waiters]

    def flush(self) -> None:
        """Write every open bucket now and wait until every bucket written so far is stored or failed."""
        with self._changed:
            self._sealed.extend(self._acc.seal_all(self._clock.now()))
            self._changed.notify_all()
            self._changed.wait_for(lambda: not self._sealed and not self._acc.in_flight)

    def close(self) -> None:
        """Stop taking pushes (``QueueClosed``), write what is buffered, stop the writer threads and close the
        client made from a URI. Idempotent."""
        with self._changed:
            self._closed = True
        self.flush()
        with self._changed:
            self._changed.notify_all()
        for writer in self._writers:
            writer.join()
        self._writers.clear()
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    drain = close

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_for_space(self, size: int) -> None:
        """Under the lock: wait until ``size`` more bytes fit in ``max_buffered_bytes`` (or nothing is buffered),
        then check that the producer still takes pushes."""
        limit = self.options.max_buffered_bytes
        self._changed.wait_for(lambda: self._closed or not self._acc.buffered_bytes
                               or self._acc.buffered_bytes + size <= limit)
        if self._closed:
            raise QueueClosed("the producer was closed; it takes no more pushes")

    def _buffered(self) -> None:
        """Under the lock, after a push: start the writers on the first one, and tell them."""
        if not self._writers:
            self._writers = [threading.Thread(target=self._write_loop, daemon=True, name=f"bucketq-writer-{i}")
                             for i in range(self.options.max_in_flight_writes)]
            for writer in self._writers:
                writer.start()
        self._changed.notify_all()

    # -- writing -------------------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        """A writer thread: write what is due (``Accumulator.ready``), a share of it at a time, until closed and
        nothing is left."""
        with self._changed:
            while True:
                self._sealed.extend(self._acc.ready(self._clock.now(), time.monotonic()))
                if self._sealed:
                    share = -(-len(self._sealed) // self.options.max_in_flight_writes)
                    batch = [self._sealed.popleft() for _ in range(share)]
                    self._changed.release()
                    try:
                        self._write(batch)
                    finally:
                        self._changed.acquire()
                    for bucket in batch:
                        self._sealed.extend(self._acc.written(bucket))  # a group's next bucket
                    self._changed.notify_all()
                    continue
                if self._closed and not self._acc.in_flight:
                    return
                deadline = self._acc.next_deadline()
                self._changed.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _write(self, batch: list[SealedBucket]) -> None:
        """Insert the buckets, retrying transient errors; resolve or fail every push they hold."""
        failed: dict[Any, BaseException] = {}
        try:
            self._set_up()
            due = self._clock.earliest()  # as the async producer: due by the earliest reading of the server clock
            for bucket in batch:
                if bucket.immediate:
                    bucket.document["due"] = due
            docs = [bucket.document for bucket in batch]
            holds = list(unique.holds(docs))
            if holds:  # unique jobs: their keys first (``bucketq.shell.unique``)
                now = self._clock.now()
                merged = retrying(lambda _: self._store.hold_keys(holds, now), timeout_s=self.options.write_timeout)
                docs = merge_held(batch, merged)
            if docs:
                failed = retrying(lambda _: self._insert(docs), timeout_s=self.options.write_timeout)
        except Exception as exc:
            failed = {bucket.id: exc for bucket in batch}
        for bucket in batch:
            bucket.resolve(failed.get(bucket.id))
        self._metrics.written(batch, failed, self._clock.now)

    def _insert(self, docs: list[dict[str, Any]]) -> dict[Any, BaseException]:
        """One attempt at the write: the buckets' partitions (a retry keeps them), then the insert."""
        self._spread.assign(docs, self._store.partition_count())
        return self._store.write_buckets(docs)

    def _ready(self) -> None:
        """Before a push, as the async ``Queue.push``: set up first if due, so that an unreachable server raises
        ``ServerUnreachable`` from the push itself."""
        if self._closed:
            raise QueueClosed("the producer was closed; it takes no more pushes")
        if self._clock.stale or not self._indexed:
            self._set_up()

    def _set_up(self) -> None:
        """Before a write: the server clock measured when stale, the indexes made once (``collection_setup``)."""
        with self._setting_up, reaching(self._uri, "setting up the queue",
                                        f"write_timeout {self.options.write_timeout:g} s"):
            if self._clock.stale:
                retrying(lambda _: self._clock.sync_blocking(self.database, self.options.write_timeout),
                         timeout_s=self.options.write_timeout)
            if not self._indexed:
                retrying(lambda _: self._store.ensure_indexes(), timeout_s=self.options.write_timeout)
                self._indexed = True

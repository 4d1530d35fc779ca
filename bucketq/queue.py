"""``Queue``: the public face. Producer and consumer share one connection, clock and wake-up signal."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from typing import Any

from bucketq import metrics
from bucketq.codecs import Codec, codec_for, codec_option
from bucketq.consumer import Consumer
from bucketq.core import claims, entries, housekeeping, unique
from bucketq.core.entries import EntryKind, Selection
from bucketq.core.format import as_utc, parse_bucket
from bucketq.core.held import SlotState
from bucketq.core.operator_writes import (
    check_message_id,
    copies_on_their_way,
    live_lease,
    pending_slots,
    unfinished_messages,
)
from bucketq.core.stats import shape_groups, shape_stats
from bucketq.errors import InvalidOption, MalformedBucket, MessageHeld
from bucketq.message import Message
from bucketq.options import QueueOptions, check_database, check_names
from bucketq.shell.cancel import cancel as cancel_message
from bucketq.shell.clock import ServerClock
from bucketq.shell.collection_setup import SetUp
from bucketq.shell.connection import connect
from bucketq.shell.housekeeping import Housekeeping
from bucketq.shell.lifecycle import Lifecycle
from bucketq.shell.pause_gate import PauseGate
from bucketq.shell.producer import Producer
from bucketq.shell.queue_internals import QueueInternals
from bucketq.shell.strays import Strays
from bucketq.shell.transaction import check_session, push_in_transaction
from bucketq.shell.unique import release_keys
from bucketq.shell.wakeup import Shared, Wakeup, Watched
from bucketq.store.aio.queue_store import AsyncQueueStore

REMOVE_ATTEMPTS = 5  # reads of a message's buckets when consumers keep claiming them meanwhile
PURGE_CHUNK = 1000
log = logging.getLogger("bucketq")


class Queue:
    """A queue stored as bucket documents in the collection ``name``.

    ``target`` is a MongoDB URI, an ``AsyncMongoClient``, an ``AsyncDatabase`` or a Motor client/database;
    ``db`` picks the database (default: the URI's, else "bucketq"). ``codec`` is "json" (default, orjson),
    "msgpack", "bson" (payloads stored as BSON documents, which Spark reads without a JSON parse) or any object
    with ``name``, ``dump`` and ``load``. Other keywords are ``QueueOptions`` and are validated here.
    """

    def __init__(self, target: Any, *, name: str, db: str | None = None, codec: str | Codec = "json",
                 **options: Any) -> None:
        check_names(name, db)  # before connect(): pymongo's errors for a bad db are not InvalidOption
        unknown = set(options) - set(QueueOptions.__dataclass_fields__)
        if unknown:
            raise InvalidOption(f"unknown option(s): {', '.join(sorted(unknown))}")
        self.options = QueueOptions(**options)
        self.codec = codec_option(codec)
        self.name = name
        self._connection = connect(target, db)
        check_database(self._connection.database, name, self.options.write_concern)
        self._store = AsyncQueueStore(self._connection.database, name, write_concern=self.options.write_concern,
                                      op_timeout_s=self.options.write_timeout, partitions=self.options.partitions,
                                      rate_limit=self.options.rate_limit)
        self._clock = ServerClock()
        self._wakeup = Wakeup(self.options.poll_interval)
        self._pause = PauseGate(self._store.read_pause)  # one per queue object: a pause it writes holds at once
        self._producer = Producer(self._store, self.codec, self.options, self._clock,
                                  on_written=self._wakeup.notify, before_write=self._ready, mark_checked=True)
        self._consumer = Consumer(self._store, self.codec, self.options, self._clock, self._wakeup, self._pause,
                                  before_claim=self._before_claim)
        # the change streams a consumer keeps open (``_before_claim``): made once, not at every claim. The queue
        # objects of a process on one client share them, one per collection (``wakeup.ChangeFeed``); a new bucket
        # wakes one of them that waits, not all.
        on = (id(self.database.client), self.database.name, name)
        self._watches: list[Watched] = [Shared((*on, "changes"), self._store.watch_changes, spread=True),
                                        Shared((*on, "control"), self._store.watch_control, self._pause.changed)]
        self._housekeeping = Housekeeping(self._store, self._clock, self._keep_house)
        self._life = Lifecycle("queue", SetUp(self._connection, self._clock, self._store.ensure_indexes,
                                              self.options.write_timeout))
        self._strays = Strays(self._store, self._clock)
        self._internals = QueueInternals(self._store, self._clock, self._ready, self._wakeup.notify)

    @property
    def database(self) -> Any:
        """The database the queue's collections live in (an ``AsyncDatabase``, Motor's or the in-memory one)."""
        return self._connection.database

    async def _ready(self, *, write: bool = True) -> None:
        """Set up before use (``shell.collection_setup``): the server clock, and the indexes before the first write."""
        await self._life.ready(write=write)

    # -- producing -----------------------------------------------------------------------------------------

    async def push(self, payload: Any, *, delay: float | dt.timedelta | None = None, at: dt.datetime | None = None,
                   headers: Mapping[str, Any] | None = None, key: str | None = None, session: Any = None,
                   group: str | None = None, priority: int = 0,
                   unique_for: float | dt.timedelta | None = None) -> str:
        """Buffer a message; return its id once the bucket holding it is acknowledged by the write concern.
        ``delay`` (seconds) or ``at`` (aware datetime) schedule it; ``key`` is its dedupe key; ``group`` makes it
        part of an ordered group (delivered in push order, one at a time: docs/guide/ordered-groups.md); ``priority``
        (0, the default, to 9) puts it before the due messages of lower levels (docs/guide/priorities.md). With
        ``unique_for`` (seconds), a push of ``key`` while a job of that key is pending or in flight, for at most
        ``unique_for`` seconds, is merged into it: it returns that job's id (docs/guide/unique-jobs.md). With
        ``session`` (a session of this queue's client, in a transaction) the message is written at once in that
        transaction, unbuffered, as a bucket of its own: it is stored if and only if the transaction commits."""
        if session is not None:
            if group is not None:
                raise InvalidOption("group cannot be combined with session (a transaction's bucket is not ordered)")
            if unique_for is not None:
                raise InvalidOption("unique_for cannot be combined with session (its key is held outside the "
                                    "transaction)")
            # open before the transaction: the first write creates the collection and indexes, outside any
            check_session(session, self.database.client)
            await self._ready()
            slot, _, due = self._producer._prepare(payload, delay, at, headers, key, None, priority)
            return await push_in_transaction(self._store, session, slot, codec=self.codec.name,
                                             now=self._clock.now(), due=due, priority=priority)
        if self._life.closed or self._life.pending():
            await self._ready()
        return await self._producer.push(payload, delay, at, headers, key, group, priority, unique_for)

    def push_nowait(self, payload: Any, *, delay: float | dt.timedelta | None = None, at: dt.datetime | None = None,
                    headers: Mapping[str, Any] | None = None, key: str | None = None,
                    group: str | None = None, priority: int = 0,
                    unique_for: float | dt.timedelta | None = None) -> asyncio.Future[str]:
        """Buffer a message and return a future of its id, for callers who pipeline."""
        # positionally, in the producer's order: eight keywords to match cost a push about 500 instructions
        return self._producer.push_nowait(payload, delay, at, headers, key, group, priority, unique_for)

    async def push_many(self, payloads: Iterable[Any], *, delay: float | dt.timedelta | None = None,
                        headers: Mapping[str, Any] | None = None, priority: int = 0) -> list[str]:
        """Push many messages at once and return their ids, in order, once all are stored. Items are payloads,
        or ``bucketq.Outgoing`` items carrying options of their own; ``delay``, ``headers`` and ``priority`` apply to
        the items that set none. Cheaper per message than ``push``: the call's messages are encoded together."""
        await self._ready()
        return await self._producer.push_many(payloads, delay=delay, headers=headers, priority=priority)

    async def flush(self) -> None:
        """Write every open bucket now and wait for all writes, without closing the queue."""
        await self._producer.flush()

    # -- consuming -----------------------------------------------------------------------------------------

    # reserve, reserve_many and ack_many hand back the consumer's coroutine to await, not one of their own: one
    # coroutine fewer a call, on the path of every message.

    def reserve(self, timeout: float | None = None) -> Coroutine[Any, Any, Message | None]:
        """Claim the next message; None when none arrives within ``timeout`` seconds."""
        return self._consumer.reserve(timeout)

    def reserve_many(self, n: int, timeout: float | None = None) -> Coroutine[Any, Any, list[Message]]:
        """Up to ``n`` messages for a handler that takes many at once: waits up to ``timeout`` seconds for the
        first, then adds those due now, from the buckets this consumer holds and, while fewer than ``n``, from
        further buckets it claims, without waiting. Empty when none arrives in time. Each message is acked or
        nacked on its own, or the batch at once with ``ack_many``."""
        return self._consumer.reserve_many(n, timeout)

    def ack_many(self, messages: Iterable[Message], *, wait: bool = False) -> Coroutine[Any, Any, None]:
        """Ack messages this queue handed out (a ``reserve_many`` batch) in one call: as ``await m.ack(wait=wait)``
        of each in turn, the first that raises (``LeaseLost``, ``AlreadyResolved``) stopping it with the ones before
        it acked, at a fraction of the CPU. ``InvalidOption``, before any ack, for anything else in the list."""
        return self._consumer.ack_many(messages, wait=wait)

    async def pop(self, timeout: float | None = None) -> Message | None:
        """Reserve and ack in one step (at-most-once from here on: the message is not redelivered)."""
        message = await self.reserve(timeout)
        if message is not None:
            await message.ack()
        return message

    async def consume(self, idle_timeout: float | None = None) -> AsyncIterator[Message]:
        """``async for msg in q.consume(): ...``; ends after ``idle_timeout`` seconds without a message."""
        async for message in self._consumer.consume(idle_timeout):
            yield message

    async def _before_claim(self) -> None:
        """What the consumer awaits before each claim (not before each reserve: a message at hand needs none of
        it): before the first, set up and start housekeeping (its deletes run in one consumer of the queue at a
        time: ``Housekeeping``); then only what is due (a clock resync, a change stream lost to a server
        restart)."""
        if self._life.housekeeping is None or self._clock.stale:
            await self._ready()
            self._life.keep_house(housekeeping.HOUSEKEEPING_EVERY_S, self._housekeeping.round, "housekeeping",
                                  "bucketq-housekeeping")
        if self.options.change_streams is not False:
            self._wakeup.start_stream(self._watches, self._clock, required=bool(self.options.change_streams))

    # -- observing -----------------------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """``ready``, ``scheduled``, ``in_flight``, ``dead``, ``quarantined``, ``buckets``,
        ``oldest_ready_age_s``: messages by state, counted on the server; ``ready_by_priority``: the ready
        messages by priority level, ``{level: count}`` for each level with any, highest first; ``pending``: the
        autoscaling signal, messages that need a worker now (``ready + in_flight``; see
        ``bucketq.metrics.pending_messages``), also recorded for the ``bucketq.pending`` gauge; and ``groups``:
        ordered groups with messages left by what they wait for (``served``, ``ready``, ``retry``, ``waiting``:
        see ``bucketq.core.stats.GROUP_STATES``), each ``{groups, messages, until}``; ``cancelled``: the records
        of cancelled messages (``cancel``), among ``dead``; ``not_buckets``: the documents of the queue's
        collection that no claim can take, left out of the counts above (``not_buckets()`` lists them);
        ``rate_limit``: the queue's stored limit as ``{limit, per}``, or None. Writes nothing."""
        await self._ready(write=False)
        # By the latest reading of the server's clock: a message another client pushed a moment ago, due by its
        # own reading, counts as ready here even when this host's estimate is a millisecond behind that one's.
        now = self._clock.latest()
        rows, dead, quarantined, groups = await self._store.stats(now)
        row = shape_stats(rows, dead=dead, quarantined=quarantined, now=now)
        row["pending"] = metrics.record_pending(self.name, self.database.name, row)
        row["cancelled"] = await self._store.count_cancelled()
        limit = await self._store.stored_rate_limit()
        return {**row, "groups": shape_groups(groups), "not_buckets": await self._store.count_strays(),
                "rate_limit": None if limit is None else {"limit": limit.limit, "per": limit.per}}

    async def not_buckets(self, limit: int = 10) -> dict[str, Any]:
        """The documents of the queue's collection that no claim can take (a ``due`` that is not a date, a ``pt``
        that is no partition of the queue): ``{"count", "documents"}``, up to
        ``limit`` of them as ``{"id", "reason"}``. Those with the format's version field ``v`` are broken buckets,
        which consumers move to quarantine (within ``bucketq.shell.strays.SWEEP_EVERY_S``); the others are not
        buckets (say, an application's own documents in the queue's collection) and stay. A scan; writes nothing."""
        await self._ready(write=False)
        return await self._strays.report(limit)

    async def peek(self, n: int = 10) -> list[dict[str, Any]]:
        """The next ``n`` unfinished messages in due order, without claiming them (nor writing anything): each
        with its ``id``, ``due``, ``tries``, ``priority`` (its level, 0 by default) and ``payload``. This is the
        order of claims except for priorities: claims take the due messages of higher levels first. Documents no
        claim can take are left out (``not_buckets`` lists them)."""
        if n <= 0:
            return []
        await self._ready(write=False)
        out: list[dict[str, Any]] = []
        cursor = await self._store.live_buckets()
        async for doc in cursor:
            try:
                bucket = parse_bucket(doc)
                codec = codec_for(bucket.codec, self.codec)
            except (MalformedBucket, ValueError) as exc:
                out.append({"bucket": doc.get("_id"), "malformed": str(exc)})
                continue
            for slot in range(bucket.size):
                if slot in bucket.done:
                    continue
                entry: dict[str, Any] = {"id": bucket.message_id(slot), "due": as_utc(doc["due"]),
                                         "tries": bucket.base_tries[slot], "priority": bucket.priority}
                try:
                    entry["payload"] = codec.load(bucket.payloads[slot])
                except Exception as exc:
                    entry["undecodable"] = f"{type(exc).__name__}: {exc}"
                out.append(entry)
                if len(out) >= n:
                    await cursor.close()
                    return out
        return out

    # -- dead letters and quarantine -----------------------------------------------------------------------

    async def dead_letters(self, *, limit: int = 100, older_than: float | None = None,
                           error_contains: str | None = None) -> list[dict[str, Any]]:
        """The dead letters, oldest first, up to ``limit``: each with its ``_id``, payload, tries and ``error``;
        filtered by age (``older_than`` seconds) and by text in the error."""
        return await self._list(EntryKind.DEAD, limit, older_than, error_contains)

    async def requeue_dead(self, *, ids: list[str] | None = None, older_than: float | None = None,
                           error_contains: str | None = None) -> int:
        """Put dead letters back in the queue, tries reset, ids kept. Returns how many."""
        return await self._requeue(EntryKind.DEAD, ids, older_than, error_contains)

    async def purge_dead(self, *, ids: list[str] | None = None, older_than: float | None = None,
                         error_contains: str | None = None) -> int:
        """Delete dead letters (all, or those of ``ids``, or by age and error text). Returns how many."""
        return await self._purge(EntryKind.DEAD, ids, older_than, error_contains)

    async def quarantined(self, *, limit: int = 100, older_than: float | None = None,
                          error_contains: str | None = None) -> list[dict[str, Any]]:
        """The quarantine entries, oldest first, up to ``limit``: buckets or messages that could not be served as
        stored, each with its ``reason``, host and pid; filtered by age and by text in the reason."""
        return await self._list(EntryKind.QUARANTINE, limit, older_than, error_contains)

    async def requeue_quarantined(self, *, ids: list[Any] | None = None, older_than: float | None = None,
                                  error_contains: str | None = None) -> int:
        """Put quarantined buckets (as they were) and messages back in the queue. Returns how many entries."""
        return await self._requeue(EntryKind.QUARANTINE, ids, older_than, error_contains)

    async def purge_quarantined(self, *, ids: list[Any] | None = None, older_than: float | None = None,
                                error_contains: str | None = None) -> int:
        """Delete quarantine entries (all, or those of ``ids``, or by age and reason text). Returns how many."""
        return await self._purge(EntryKind.QUARANTINE, ids, older_than, error_contains)

    async def purge_expired(self) -> dict[str, int]:
        """Apply the retention options: quarantine entries, dedupe keys and finished buckets' tombstones older
        than them are deleted (a retention of None keeps them forever). Consumers do it every minute, one of
        each queue at a time (``bucketq.core.housekeeping``)."""
        now = self._clock.now()
        counts = {}
        for key, expire, retention in (("quarantined", self._store.expire_quarantined,
                                        self.options.quarantine_retention),
                                       ("inbox", self._store.expire_dedupe_keys, self.options.inbox_retention)):
            counts[key] = 0 if retention is None else await expire(now - dt.timedelta(seconds=retention))
        counts["tombstones"] = await self._store.reap_tombstones(now, self.options.tombstone_retention)
        return counts

    async def _keep_house(self) -> None:
        """A consumer's housekeeping round: the retention options applied, and broken buckets that no claim can
        take moved to quarantine (``shell.strays``, at most every ``SWEEP_EVERY_S``)."""
        await self.purge_expired()
        await self._strays.sweep()

    async def _list(self, kind: EntryKind, limit: int, older_than: float | None,
                    error_contains: str | None) -> list[dict[str, Any]]:
        await self._ready(write=False)
        selection = Selection(self._clock.latest(), older_than, error_contains)
        return await self._store.entries(kind, selection, limit=limit)

    async def _purge(self, kind: EntryKind, ids: list[Any] | None, older_than: float | None,
                     error_contains: str | None) -> int:
        await self._ready()
        return await self._store.purge_entries(kind, Selection(self._clock.latest(), older_than, error_contains, ids))

    async def _requeue(self, kind: EntryKind, ids: list[Any] | None, older_than: float | None,
                       error_contains: str | None) -> int:
        """Copy entries back as buckets, then delete them: a crash in between requeues twice, never loses."""
        await self._ready()
        selection = Selection(self._clock.latest(), older_than, error_contains, ids)
        total = 0
        while batch := await self._store.requeue_chunk(kind, selection, limit=entries.REQUEUE_CHUNK):
            docs = entries.requeued_buckets(batch, now=self._clock.now())
            await self._store.insert_buckets(docs)
            await self._store.delete_requeued(kind, batch)
            total += len(batch)
        if total:
            self._wakeup.notify()
        return total

    # -- operator controls (pause, remove, purge) ------------------------------------------------------------

    async def pause(self) -> None:
        """Pause the queue for every consumer, in every process: they stop claiming buckets once the change
        stream on ``<name>.control`` announces it (within ``bucketq.shell.pause_gate.PAUSE_REFRESH_S``, 1 s, without
        change streams), go on serving and flushing the buckets they already hold, and
        claim again after ``resume()``. Pushes still work. Stored in the ``<name>.control`` collection."""
        await self._write_pause(True)

    async def resume(self) -> None:
        """Undo ``pause()``: consumers claim again once the change stream announces it (within
        ``PAUSE_REFRESH_S`` without change streams: a paused one reads the pause document that often)."""
        await self._write_pause(False)

    async def paused(self) -> bool:
        """Whether the queue is paused, read from the server now. Writes nothing."""
        await self._ready(write=False)
        paused = await self._store.read_pause()
        self._pause.set(paused)
        return paused

    async def _write_pause(self, paused: bool) -> None:
        await self._ready()
        await self._store.write_pause(paused, now=self._clock.now(), by=claims.owner_name())
        self._pause.set(paused)  # this process's consumer follows at once
        if not paused:
            self._wakeup.notify()

    async def remove(self, message_id: str) -> bool:
        """Remove a pending message by id so that no consumer delivers it: its slot is marked done, as an ack
        would, in every bucket that holds it (a retry copy too). Returns True when removed, False when no
        pending message has this id (unknown, already finished, or not yet written by its producer).

        Raises ``MessageHeld``, removing nothing, when a consumer holds a bucket of it under a live lease: that
        consumer may be handling the message now. A bucket whose lease expired is taken back from its late
        claimant (whose writes are then refused). Finding retry copies scans the queue's buckets."""
        message_id = check_message_id(message_id)
        await self._ready()
        removed = False
        for _ in range(REMOVE_ATTEMPTS):
            docs = await self._store.holders(message_id)
            now = self._clock.now()
            found = [(doc, slots) for doc in docs if (slots := pending_slots(doc, message_id))]
            for doc, _ in found:
                if (lease := live_lease(doc, now)) is not None:
                    raise MessageHeld(f"message {message_id!r} is in bucket {doc['_id']}, which "
                                      f"{lease.get('owner', 'a consumer')} holds until {doc.get('due')}: it may be "
                                      f"handling it now; remove it once it is resolved or the lease has ended"
                                      f"{' (its other copies were removed)' if removed else ''}")
            applied = [await self._remove_from(doc, slots, now) for doc, slots in found]
            removed = removed or any(applied)
            if all(applied):  # else a bucket was claimed or released since it was read: read again
                return removed
        raise MessageHeld(f"message {message_id!r} kept being claimed while it was being removed; try again")

    async def _remove_from(self, doc: dict[str, Any], slots: list[int], now: dt.datetime) -> bool:
        """Mark ``slots`` of the bucket ``doc`` done, if it is still as read; a removed unique job is finished, so
        its key is freed (else a push of the key would merge into a job no one will run)."""
        applied = await self._store.remove_slots(doc, slots, now)
        if applied and "u" in doc:
            await release_keys(self._store, parse_bucket(doc), dict.fromkeys(slots, SlotState.ACKED))
        return applied

    async def cancel(self, message_id: str) -> str:
        """Cancel a message by id so that it is not delivered (again) and not retried. Returns:

        - ``"cancelled"``: it was pending (or cancelled already): it will not be delivered, and its record is in
          the dead letters (``error: "cancelled"``, ``cancelled: true``: ``requeue_dead`` brings it back);
        - ``"requested"``: a consumer holds it, maybe handling it now. The consumer reads the request after a lease
          extension, within about ``lease / 2``: the handler sees ``message.cancelled`` (or awaits
          ``message.wait_cancelled()``), and the message ends as cancelled however the handler resolves it; one not
          yet handed out by then is never delivered. A message resolved before the consumer read the request keeps
          that outcome. Call ``cancel`` again to see which;
        - ``"not_found"``: no pending message has this id (unknown, finished, or not yet written).

        Finding retry copies scans the queue's buckets, as ``remove`` does. A batch consumer (``BatchQueue``, the
        Spark driver) ends a message as cancelled when the request is on its bucket at the claim; it does not hear
        of one made while it holds the bucket."""
        message_id = check_message_id(message_id)
        await self._ready()
        return await cancel_message(self._store, self._clock, message_id)

    async def purge(self) -> int:
        """Delete every message in the queue (ready, scheduled or in flight) and return how many there were.
        Their buckets end as finished ones do, as tombstones, so a producer's late insert retry cannot store
        one again; a consumer holding one has its writes refused (``LeaseLost``). Dead letters, quarantine
        and dedupe keys are kept; the keys of the unique jobs it deletes are freed. Messages pushed while it runs
        may be purged or kept; a message nacked while it runs is purged with its retry copy, also one whose insert
        lands after the purge (``claims.guard``)."""
        await self._ready()
        now = self._clock.now()
        # ``late`` marks retry copies that landed after the mark: each repeats a message its original counts.
        token, late = claims.new_token(), claims.new_token()
        await self._store.mark_purged(now, token)
        total = 0
        while batch := await self._store.purged_buckets(token, late, limit=PURGE_CHUNK):
            total += sum(unfinished_messages(doc) for doc in batch if doc["fin"]["token"] == token)
            copies = [c for doc in batch for c in copies_on_their_way(doc)]
            if copies:  # those that its buckets' claimants may still be inserting
                await self._store.end_copies(copies, now, late)
            await self._store.tombstone_purged(batch, now)
            held = {key: m for doc in batch for key, m in unique.held_by(doc).items()}
            if held:  # the purged unique jobs' keys: free now, not at their ``until``
                await self._store.release_keys(held)
        return total

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Flush every open bucket and wait for its write; flush consumer state and release held buckets.
        The queue takes no pushes or reserves afterwards."""
        await self._producer.drain()
        await self._consumer.drain()

    async def close(self) -> None:
        """Drain (see ``drain``), then stop every background task and close the connection the queue opened.
        Leaving ``async with`` calls it. Safe to call twice."""
        await self._life.close(self.drain, self._wakeup.stop, self._housekeeping.give_up, self._connection.close)

    async def __aenter__(self) -> Queue:
        await self._ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def internals(queue: Queue) -> QueueInternals:
    """``queue``'s store, clock, set-up and wake-up, for bucketq's own modules built on it (``QueueInternals``)."""
    return queue._internals

"""``AsyncQueueStore``: every command bucketq sends to a queue's collections, with retries on transient errors.

Collections of queue ``name``: ``name`` (buckets), ``name.dead``, ``name.quarantine``, ``name.inbox``,
``name.control`` (operator controls: the pause document), ``name.groups`` (locks of ordered groups), ``name.unique``
(the keys unique jobs hold). The
filters and updates come from the sans-I/O core (``bucketq.core``); this class runs them. Every command on the
buckets collection is a method here, so that a change to all of them (a shard key in every filter) is made in
this one class. Written async once; ``bucketq.store.sync.QueueStore`` is generated from it
(``devtools/unasync.py``) for the Spark driver's ``BatchQueue``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from pymongo import ReplaceOne, ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure

from bucketq.core import (
    claims,
    groups,
    housekeeping,
    rate_limit,
    sharding,
    unique,
)
from bucketq.core import schedule as ticks  # async-only
from bucketq.core.cancel import CANCELLED_RECORDS, record_filter, request
from bucketq.core.claims import LIVE, TOMBSTONE_DUE, claim_uncounted
from bucketq.core.entries import EntryKind, Selection
from bucketq.core.format import (
    CONTROL_SUFFIX,
    DEAD_SUFFIX,
    GROUPS_SUFFIX,
    INBOX_SUFFIX,
    QUARANTINE_SUFFIX,
    RATE_SUFFIX,
    UNIQUE_SUFFIX,
)
from bucketq.core.held import FlushPlan
from bucketq.core.operator_writes import (
    PAUSE,
    PURGED_FIELDS,
    holders,
    initial_pause,
    is_paused,
    purge_mark,
    purged_by,
    removal,
    set_pause,
)
from bucketq.core.priorities import PRIORITY
from bucketq.core.rate_limit import RateLimit
from bucketq.core.retry import is_transient
from bucketq.core.scans import SCAN
from bucketq.core.sharding import (
    LAYOUT,
    PARTITION,
    adopted_partitions,
    assign_by_id,
    every_partition,
    key,
    layout_update,
)
from bucketq.core.stats import groups_pipeline, stats_pipeline
from bucketq.core.strays import BROKEN, DATED, strays
from bucketq.store.aio.base import collections, insert_copies, insert_new, retrying
from bucketq.store.aio.changes import STREAM_AWAIT_MS, WATCH_CHANGES, WATCH_CONTROL  # async-only


async def _read_before(doc: dict) -> bool:
    """For ``insert_new``: a unique key already stored is not taken as this insert's until it is read."""
    return False


class AsyncQueueStore:
    def __init__(self, database: Any, name: str, *, write_concern: int | str | None = None,
                 op_timeout_s: float = 30.0, partitions: int | None = None,
                 rate_limit: RateLimit | None = None) -> None:
        self.database = database
        self.name = name
        self.wanted = partitions  # the client's count, checked against the queue's; None: adopt the queue's
        self._partitions: int | None = None  # the queue's count once stored (``partition_count``)
        self.wanted_rate = rate_limit  # the client's limit, checked against the queue's; None: adopt the queue's
        self.rate_limit: RateLimit | None = None  # the queue's, learned at set-up (``ensure_indexes``)
        (self.buckets, self.dead, self.quarantine, self.inbox, self.control, self.groups, self.unique,
         self.rate) = collections(database, name, write_concern, "", DEAD_SUFFIX, QUARANTINE_SUFFIX, INBOX_SUFFIX,
                                  CONTROL_SUFFIX, GROUPS_SUFFIX, UNIQUE_SUFFIX, RATE_SUFFIX)
        self.op_timeout_s = op_timeout_s

    async def ensure_indexes(self) -> None:
        """Claims pin a partition and sort by level (``pr``, highest first) and ``due``, or by ``due`` alone (claims by
        age, the next due time); tombstones, dead letters and quarantine are listed or
        purged by time. (The test server accepts and ignores non-unique indexes.)"""
        await self.buckets.create_index([(PARTITION, 1), ("due", 1)])
        await self.buckets.create_index([(PARTITION, 1), (PRIORITY, -1), ("due", 1)])  # claims by priority
        await self.buckets.create_index("fin.at", sparse=True)
        # live group buckets only (ungrouped ones and tombstones have neither field); a group's queries also pin
        # its partition, which the shard key routes by
        await self.buckets.create_index([("g", 1), ("s", 1)], sparse=True)
        await self.dead.create_index("at")
        await self.quarantine.create_index("at")
        await self.inbox.create_index("at")
        # A real MongoDB deletes expired unique keys; elsewhere the next push of the key takes it over.
        await self.unique.create_index("until", expireAfterSeconds=0)
        await self.control.update_one(PAUSE, initial_pause(), upsert=True)  # never overwrites a pause
        layout = await self.control.find_one_and_update(LAYOUT, layout_update(self.wanted), upsert=True,
                                                        return_document=ReturnDocument.AFTER)
        self._partitions = adopted_partitions(layout, self.wanted)
        if self.wanted_rate is not None and rate_limit.STORED not in layout:  # the first client that names one
            query, update = rate_limit.store(self.wanted_rate)
            stored = await self.control.find_one_and_update({**LAYOUT, **query}, update,
                                                            return_document=ReturnDocument.AFTER)
            layout = stored or await self.control.find_one(LAYOUT)  # None: another client stored one first
        self.rate_limit = rate_limit.adopted(layout, self.wanted_rate)

    async def stored_rate_limit(self) -> RateLimit | None:
        """The queue's rate limit as stored now (``rate_limit.adopted``), for operators; None when it has none."""
        return rate_limit.adopted(await self.control.find_one(LAYOUT), None)

    async def partition_count(self) -> int:
        """The queue's partition count (``sharding.adopted_partitions``): learned at set-up (``ensure_indexes``),
        or before it (read-only calls) from one read of the layout, kept once the queue has one. A queue without
        a layout (not created yet) is read again next time: its first set-up may give it more partitions."""
        if self._partitions is None:
            layout = await self.control.find_one(LAYOUT)
            count = adopted_partitions(layout, self.wanted)
            if layout is None:
                return count
            self._partitions = count
        return self._partitions

    # async-only: begin
    async def watch_changes(self, start: Any) -> Any:
        """A change stream, from ``start`` (a cluster time) on, of the changes that can make a bucket claimable
        (``changes.WATCH_CHANGES``), each with its bucket's due time only."""
        return await self.buckets.watch(WATCH_CHANGES, start_at_operation_time=start,
                                        max_await_time_ms=STREAM_AWAIT_MS)

    async def watch_control(self, start: Any) -> Any:
        """A change stream, from ``start`` on, of the writes to ``name.control``: a pause or a resume."""
        return await self.control.watch(WATCH_CONTROL, start_at_operation_time=start,
                                        max_await_time_ms=STREAM_AWAIT_MS)

    # async-only: end
    # -- producer ------------------------------------------------------------------------------------------

    async def write_buckets(self, docs: list[dict]) -> dict[Any, BaseException]:
        """One attempt at the producer's write: group buckets numbered, then all inserted (``insert_new``).
        Returns the ``_id``s that failed for good; raises on transient errors (the producer retries). Each bucket
        comes with its partition (``pt``), which the producer gave it (``sharding.Spread``)."""
        await self.number_groups(docs)
        return await insert_new(self.buckets, docs)

    async def insert_copies(self, target: Any, docs: list[dict]) -> None:
        """Insert idempotent copies into ``target`` (one of this store's collections), retried; failures raise."""
        await insert_copies(target, docs, timeout_s=self.op_timeout_s)

    async def insert_buckets(self, docs: list[dict], *, session: Any = None) -> None:
        """Insert buckets made whole outside the producer (``push(session=...)``, the outbox relay, a requeue).
        With a session: once, in its transaction, whose errors are the caller's to handle (a retry belongs to the
        whole transaction). Without: retried; a duplicate key means that bucket is already stored; group buckets
        (a requeue) are numbered first, to go to the end of their groups. Buckets without a partition get the one
        their ``_id`` hashes to: the same for every writer of the same bucket (``sharding.assign_by_id``)."""
        assign_by_id(docs, await self.partition_count())
        if session is not None:
            await self.buckets.insert_many(docs, session=session)
        else:
            await retrying(lambda _: self.number_groups(docs), timeout_s=self.op_timeout_s)
            await self.insert_copies(self.buckets, docs)

    # -- consumer ------------------------------------------------------------------------------------------

    async def claim(self, spec: tuple[dict, dict, list]) -> tuple[dict | None, str | None]:
        """Claim one bucket (``core.claims.claim``): (the bucket, None), (None, None) when none is due, or (the
        bucket, why it must go to quarantine) for a bucket whose ``c`` is not a number: its ``$inc`` fails, so it
        is claimed without the ``$inc`` (``claims.claim_uncounted``), or it would block every claim behind it.
        Not retried: a claim that got through but whose reply was lost simply expires with its lease."""
        try:
            return await self._find_and_claim(spec), None
        except OperationFailure as exc:
            if is_transient(exc):
                raise
            doc = await self._find_and_claim(claim_uncounted(spec))
            if doc is None:
                raise
            return doc, f"cannot be claimed: {exc}"

    async def _find_and_claim(self, spec: tuple[dict, dict, list]) -> dict | None:
        query, update, sort = spec
        return await self.buckets.find_one_and_update(query, update, sort=sort, return_document=ReturnDocument.AFTER)

    async def update_fenced(self, query: dict, update: dict, *, mine: dict | None = None) -> bool:
        """Apply a write to a bucket fenced by the claimant's token; True when it was applied, False when it was
        refused (the lease was lost). A retry after an ambiguous error that matches nothing counts as applied
        only if ``mine`` matches: a filter that nothing but this token's own earlier attempt can satisfy (a
        release clears the token but records it). Without ``mine``, such a retry means the lease was lost: done
        slots or a missing bucket may be another claimant's work, never proof of ours."""

        async def op(retry: bool) -> bool:
            result = await self.buckets.update_one(query, update)
            return result.matched_count == 1 or (retry and mine is not None and await self._matches(mine))

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def finish_fenced(self, query: dict, tombstone: dict, mine: dict) -> bool:
        """Replace a finished bucket by its tombstone (see ``claims.finish``); True when this token's write
        did it. A retry that finds the bucket gone or finished by someone else is refused."""

        async def op(retry: bool) -> bool:
            result = await self.buckets.replace_one(query, tombstone)
            return result.matched_count == 1 or (retry and await self._matches(mine))

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def fenced_many(self, writes: dict[Any, Any], proofs: dict[Any, dict]) -> list[Any]:
        """Run fenced per-bucket writes (bucket id -> ``UpdateOne``/``ReplaceOne``) in one bulk write; return the
        ids of the buckets they were applied to. When some write matched nothing, or after an ambiguous error
        (the first attempt may have been applied and its reply lost, so that the retry matches nothing: a
        release or finish clears the token), ``proofs[id]`` asks the bucket itself: only the token's own mark
        counts, not a bucket that someone else changed or finished."""
        if not writes:
            return []
        ops = list(writes.values())

        async def op(retry: bool) -> list[Any]:
            result = await self.buckets.bulk_write(ops, ordered=False)
            if not retry and result.matched_count == len(ops):
                return list(writes)
            cursor = self.buckets.find({"$or": list(proofs.values())}, {"_id": 1})
            marked = {d["_id"] for d in await cursor.to_list(None)}
            return [i for i in writes if i in marked]

        return await retrying(op, timeout_s=self.op_timeout_s)
    # async-only: begin

    async def finish_many(self, finishes: dict[Any, tuple[dict, dict, dict]]) -> list[Any]:
        """``finish_fenced`` of several buckets (bucket id -> its query, tombstone and ``mine``) in one bulk write
        (``fenced_many``): the ids of the buckets this write finished."""
        writes = {i: ReplaceOne(query, tombstone) for i, (query, tombstone, _) in finishes.items()}
        return await self.fenced_many(writes, {i: mine for i, (_, _, mine) in finishes.items()})
    # async-only: end

    async def _matches(self, query: dict) -> bool:
        return await self.buckets.find_one(query, {"_id": 1}) is not None

    async def quarantine_bucket(self, entry: dict, ref: dict, token: str, now: dt.datetime) -> bool:
        """Move the bucket ``ref`` (its shard key), claimed with ``token``, to quarantine: the copy ``entry`` first,
        then the fenced finish (``claims.finish``)."""
        await self.insert_copies(self.quarantine, [entry])
        return await self.finish_fenced(claims.fenced(ref, token), claims.finish(now, token, ref[PARTITION]),
                                        claims.finished_by(ref, token))

    async def write_plan(self, plan: FlushPlan) -> bool:
        """Run a claimed bucket's flush plan (``core.held.FlushPlan``) in order: an ordered group's lock first (never
        to expire before the lease), the guard, the copies, the fenced final write. False when the lease turned out
        to be lost."""
        if plan.lock_until is not None:
            assert plan.group is not None
            if not await self.extend_group(groups.held_by(plan.group, plan.token), groups.extend(plan.lock_until)):
                return False
        if plan.guard is not None and not await self.update_fenced(plan.filter, plan.guard):
            return False
        for collection, docs in ((self.buckets, plan.retry_docs), (self.dead, plan.dead_docs),
                                 (self.quarantine, plan.quarantine_docs)):
            if docs:
                await self.insert_copies(collection, docs)
        if plan.kind == "finish":
            assert plan.mine is not None
            return await self.finish_fenced(plan.filter, plan.final, plan.mine)
        return await self.update_fenced(plan.filter, plan.final, mine=plan.mine)

    async def reap_tombstones(self, now: dt.datetime, retention_s: float) -> int:
        """Delete the tombstones of buckets finished more than ``retention_s`` before ``now`` (``claims.reap``), in
        every partition."""
        query = every_partition(claims.reap(now, retention_s), await self.partition_count())
        return (await self.buckets.delete_many(query)).deleted_count

    async def take_housekeeping(self, now: dt.datetime, token: str, owner: str, lease_s: float) -> bool:
        """Whether the consumer of ``token`` took or renewed the housekeeping lease for ``lease_s`` seconds
        (``housekeeping.take``): a duplicate ``_id`` says that another consumer holds it."""
        try:
            result = await self.control.update_one(*housekeeping.take(now, token, owner, lease_s), upsert=True)
        except DuplicateKeyError:
            return False
        return result.matched_count == 1 or result.upserted_id is not None

    async def give_up_housekeeping(self, now: dt.datetime, token: str) -> None:
        """End the housekeeping lease (``housekeeping.give_up``) if the consumer of ``token`` still holds it."""
        await self.control.update_one(*housekeeping.give_up(now, token))

    async def read_pause(self) -> bool:
        """Whether the queue is paused (``Queue.pause``), read from the server now."""
        return is_paused(await self.control.find_one(PAUSE, {"paused": 1}))

    async def write_pause(self, paused: bool, *, now: dt.datetime, by: str) -> None:
        """Pause or resume the queue (``operator_writes.set_pause``), by ``by`` at ``now``; retried."""
        update = set_pause(paused, now=now, by=by)
        await retrying(lambda _: self.control.update_one(PAUSE, update, upsert=True), timeout_s=self.op_timeout_s)

    async def known_keys(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        cursor = self.inbox.find({"_id": {"$in": keys}}, {"_id": 1})
        return {d["_id"] for d in await cursor.to_list(None)}

    async def record_keys(self, keys: list[str], now: dt.datetime) -> None:
        await self.insert_copies(self.inbox, [{"_id": k, "at": now} for k in keys])

    # -- unique jobs (core.unique) ----------------------------------------------------------------------

    async def hold_keys(self, holds: list[unique.Hold], now: dt.datetime) -> dict[unique.Hold, str]:
        """Insert the key documents of ``holds`` (``unique``); return those merged into another message, each
        with the id of the message that holds its key. One attempt: raises on transient errors, and the retry of
        the whole of it finds the keys a lost attempt inserted as its own (``unique.OWN``)."""
        merged: dict[unique.Hold, str] = {}
        pending = holds
        while pending:
            clashes = await self._insert_keys(pending)
            if not clashes:
                break
            cursor = self.unique.find({"_id": {"$in": [h.key for h in clashes]}})
            found = {d["_id"]: d for d in await cursor.to_list(None)}
            pending = []
            for hold in clashes:
                said = unique.verdict(hold, found.get(hold.key), now)
                if said == unique.EXPIRED:
                    query, update = unique.takeover(hold, now)
                    if not (await self.unique.update_one(query, update)).matched_count:
                        pending.append(hold)  # another producer took it over first: read it again
                elif said == unique.GONE:
                    pending.append(hold)  # its holder finished meanwhile: insert again
                elif said != unique.OWN:
                    merged[hold] = said
        return merged

    async def _insert_keys(self, holds: list[unique.Hold]) -> list[unique.Hold]:
        """Insert the key documents; return the holds whose key was already there (a duplicate key: whose it is,
        ``verdict`` reads; when the server does not say which keys clashed, the holds inserted read as their
        own). Other failures raise."""
        failed = await insert_new(self.unique, [h.document for h in holds], duplicate_is_mine=_read_before)
        if errors := [e for e in failed.values() if not isinstance(e, DuplicateKeyError)]:
            raise errors[0]
        return [h for h in holds if h.key in failed]

    async def release_keys(self, held: dict[str, str]) -> None:
        """Delete the keys (``{key: message id}``) still held by those messages, now finished; retried."""
        await retrying(lambda _: self.unique.delete_many(unique.finished(held)), timeout_s=self.op_timeout_s)

    # -- ordered groups (core.groups) ----------------------------------------------------------------------

    async def number_groups(self, docs: list[dict]) -> None:
        """Give the group buckets of ``docs`` not yet numbered their places (``s``), in list order, with one
        counter update. A retry after an error numbers only those still without a place."""
        by_partition: dict[int, list[dict]] = {}
        for doc in docs:
            if "g" in doc and "s" not in doc:
                by_partition.setdefault(doc[PARTITION], []).append(doc)
        for partition, unnumbered in by_partition.items():
            query, update = groups.next_places(len(unnumbered), partition)
            counter = await self.groups.find_one_and_update(query, update, upsert=True,
                                                            return_document=ReturnDocument.AFTER)
            for place, doc in enumerate(unnumbered, counter["seq"] - len(unnumbered) + 1):
                doc["s"] = place

    async def lock_group(self, query: dict, update: dict, mine: dict) -> bool:
        """Take a group's lock (``groups.acquire``); False when someone else holds it. A retry after a lost
        reply that finds the lock taken counts as ours only if ``mine`` (our token) matches."""

        async def op(retry: bool) -> bool:
            try:
                await self.groups.update_one(query, update, upsert=True)
                return True
            except DuplicateKeyError:
                return retry and await self.groups.find_one(mine, {"_id": 1}) is not None

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def extend_group(self, mine: dict, update: dict) -> bool:
        """Extend a lock we hold (fenced by ``mine``); False when it is no longer ours."""

        async def op(retry: bool) -> bool:
            return (await self.groups.update_one(mine, update)).matched_count == 1

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def unlock_group(self, mine: dict) -> None:
        """Delete a lock we hold (fenced by ``mine``); a retry that deletes nothing after a lost reply is fine:
        the lock is gone either way, and someone else's is never matched."""
        await retrying(lambda _: self.groups.delete_one(mine), timeout_s=self.op_timeout_s)

    async def group_lock(self, group: str) -> dict | None:
        return await self.groups.find_one({"_id": group})

    async def held(self, now: dt.datetime) -> tuple[list[dict], list[dict]]:
        """What consumers hold at ``now`` (``core.holdings``): the buckets under a live lease (their lease and
        slot counts only), read through the ``pt, due`` index (a held bucket's ``due`` is its lease expiry: what
        is due later is held or scheduled), and the groups' locks that have not expired (a scan of ``Q.groups``,
        which holds one counter per partition and one lock per group being served)."""
        query = every_partition({"due": {"$gt": now, "$lt": TOMBSTONE_DUE}, "lease": {"$ne": None}},
                                await self.partition_count())
        buckets = await self.buckets.find(query, {"lease": 1, "due": 1, "n": 1, "done": 1}).to_list(None)
        locks = await self.groups.find({"token": {"$exists": True}, "until": {"$gt": now}}, **SCAN).to_list(None)
        return buckets, locks

    async def next_due(self, after: dt.datetime) -> dt.datetime | None:
        """The earliest ``due`` after ``after`` among live buckets (an unclaimed bucket's due time, or a claimed
        one's lease end), or None: one document read through the ``pt, due`` index in each partition (merged)."""
        query = every_partition({"due": {"$gt": after, "$lt": TOMBSTONE_DUE}}, await self.partition_count())
        doc = await self.buckets.find_one(query, {"_id": 0, "due": 1}, sort=[("due", 1)])
        return doc["due"] if doc is not None else None

    async def first_bucket(self, query: dict, sort: list) -> dict | None:
        return await self.buckets.find_one(query, {"_id": 1, PARTITION: 1, "w": 1, "lease": 1}, sort=sort)

    async def wake(self, query: dict, update: dict) -> None:
        await retrying(lambda _: self.buckets.update_one(query, update), timeout_s=self.op_timeout_s)

    # -- observing -----------------------------------------------------------------------------------------

    async def stats(self, now: dt.datetime) -> tuple[list[dict], int, int, list[dict]]:
        """The rows of ``core.stats``'s two pipelines and the counts of dead letters and quarantine entries:
        (stats rows, dead, quarantined, group rows)."""
        rows = await (await self.buckets.aggregate(stats_pipeline(now, await self.partition_count()),
                                                   **SCAN)).to_list(None)
        dead = await self.dead.count_documents({}, **SCAN)
        quarantined = await self.quarantine.count_documents({}, **SCAN)
        group_rows = await (await self.buckets.aggregate(groups_pipeline(now), **SCAN)).to_list(None)
        return rows, dead, quarantined, group_rows

    async def live_buckets(self) -> Any:
        """A cursor over the unfinished buckets in due order (claims take higher priority levels first), a few at a
        time (``Queue.peek``), without the documents no claim can take (``strays``)."""
        return self.buckets.find(every_partition({**LIVE, **DATED}, await self.partition_count()), sort=[("due", 1)],
                                 batch_size=4)

    # -- documents no claim can take (core.strays) -----------------------------------------------------------

    async def strays(self, *, broken: bool, limit: int) -> list[dict]:
        """Up to ``limit`` live documents no claim can take: the broken buckets among them (``broken``), else all."""
        query = strays(await self.partition_count())
        return await self.buckets.find({**query, **BROKEN} if broken else query, limit=limit, **SCAN).to_list(None)

    async def count_strays(self) -> int:
        return await self.buckets.count_documents(strays(await self.partition_count()), **SCAN)

    async def quarantine_strays(self, entries: list[dict], docs: list[dict]) -> int:
        """Move broken buckets no claim can take to quarantine: their entries first (a crash in between leaves a
        copy, never a loss), then each document deleted if it still is a stray (not mended meanwhile). No claimant
        holds one, and no producer's insert retry can bring one back (bucketq writes none): nothing is fenced and no
        tombstone is left. Returns how many were deleted."""
        await self.insert_copies(self.quarantine, entries)
        query = {"$and": [strays(await self.partition_count()), {"$or": [key(doc) for doc in docs]}]}
        result = await retrying(lambda _: self.buckets.delete_many(query, **SCAN), timeout_s=self.op_timeout_s)
        return int(result.deleted_count)

    async def count_cancelled(self) -> int:
        """How many dead letters are the records of cancelled messages (``Queue.cancel``): a scan."""
        return await self.dead.count_documents(CANCELLED_RECORDS, **SCAN)

    # -- dead letters, quarantine and dedupe keys (core.entries) ----------------------------------------------

    def _entries_of(self, kind: EntryKind) -> Any:
        return self.dead if kind is EntryKind.DEAD else self.quarantine

    async def entries(self, kind: EntryKind, selection: Selection, *, limit: int, skip: int = 0) -> list[dict]:
        """Up to ``limit`` of the selected entries of ``kind``, oldest first, after the first ``skip`` of them (a
        page of a listing), in the order of the ``at`` index."""
        return await self._entries_of(kind).find(selection.filter(kind), sort=[("at", 1)], skip=skip,
                                                 limit=limit).to_list(None)

    async def count_entries(self, kind: EntryKind, selection: Selection) -> int:
        """How many entries of ``kind`` the selection takes."""
        return await self._entries_of(kind).count_documents(selection.filter(kind), **SCAN)

    async def purge_entries(self, kind: EntryKind, selection: Selection) -> int:
        """Delete the selected entries of ``kind``; returns how many."""
        return (await self._entries_of(kind).delete_many(selection.filter(kind), **SCAN)).deleted_count  # by text

    async def requeue_chunk(self, kind: EntryKind, selection: Selection, *, limit: int) -> list[dict]:
        """The next ``limit`` selected entries to requeue; ``delete_requeued`` deletes them once their buckets are
        in."""
        return await self._entries_of(kind).find(selection.filter(kind), limit=limit, **SCAN).to_list(None)

    async def delete_requeued(self, kind: EntryKind, entries: list[dict]) -> None:
        """Delete requeued entries of ``kind``, once their buckets are stored."""
        await self._entries_of(kind).delete_many({"_id": {"$in": [e["_id"] for e in entries]}})

    async def add_dead_letters(self, docs: list[dict]) -> None:
        """Insert dead letters (idempotent: their ``_id``s are the messages'), retried."""
        await self.insert_copies(self.dead, docs)

    async def add_to_quarantine(self, entries: list[dict]) -> None:
        """Insert quarantine entries (idempotent copies), retried."""
        await self.insert_copies(self.quarantine, entries)

    async def expire_quarantined(self, before: dt.datetime) -> int:
        """Delete the quarantine entries stored before ``before`` (its retention); returns how many."""
        return (await self.quarantine.delete_many({"at": {"$lt": before}})).deleted_count

    async def expire_dedupe_keys(self, before: dt.datetime) -> int:
        """Delete the dedupe keys recorded before ``before`` (their retention); returns how many."""
        return (await self.inbox.delete_many({"at": {"$lt": before}})).deleted_count

    # -- operator controls (core.operator_writes, core.cancel) ------------------------------------------------

    async def holders(self, message_id: str) -> list[dict]:
        """The buckets that hold the message ``message_id`` (``operator_writes.holders``): a scan, for retry copies
        too."""
        return await self.buckets.find(holders(message_id), **SCAN).to_list(None)

    async def remove_slots(self, doc: Mapping[str, Any], slots: list[int], now: dt.datetime) -> bool:
        """Mark ``slots`` of the bucket ``doc`` done if it is still as read (``operator_writes.removal``); not
        retried: True when it matched."""
        return (await self.buckets.update_one(*removal(doc, slots, now))).matched_count == 1

    async def request_cancel(self, doc: Mapping[str, Any], slots: list[int]) -> dict | None:
        """The cancel request of ``slots`` on the bucket ``doc`` (``cancel.request``), retried (``$addToSet``:
        a repeat changes nothing): the bucket as the request left it, or None when it matched nothing (finished
        meanwhile)."""
        query, update = request(doc, slots)
        return await retrying(lambda _: self.buckets.find_one_and_update(query, update,
                                                                         return_document=ReturnDocument.AFTER),
                              timeout_s=self.op_timeout_s)

    async def cancel_requests(self, ref: dict) -> Any:
        """The cancel requests on a held bucket (its ``x``, ``core.cancel``), None when it has none."""
        doc = await self.buckets.find_one(ref, {"x": 1})
        return None if doc is None else doc.get("x")

    async def cancel_recorded(self, message_id: str) -> bool:
        """Whether a message's cancellation record is in the dead letters (``cancel.record_filter``)."""
        return await self.dead.find_one(record_filter(message_id), {"_id": 1}) is not None

    async def mark_purged(self, now: dt.datetime, token: str) -> None:
        """Mark every unfinished bucket purged by ``token`` (``operator_writes.purge_mark``), retried: the mark is
        idempotent. A scan (``core.scans``)."""
        update = purge_mark(now, token)
        await retrying(lambda _: self.buckets.update_many(LIVE, update, **SCAN), timeout_s=self.op_timeout_s)

    async def purged_buckets(self, *tokens: str, limit: int) -> list[dict]:
        """Up to ``limit`` buckets marked by one of the purges of ``tokens`` and not yet tombstones
        (``operator_writes.purged_by``), with the fields a purge counts and ends them by."""
        return await self.buckets.find(purged_by(*tokens), PURGED_FIELDS, limit=limit, **SCAN).to_list(None)

    async def tombstone_purged(self, docs: list[dict], now: dt.datetime) -> None:
        """Replace purged buckets by their tombstones, each fenced by its purge's token, in one bulk write,
        retried (idempotent)."""
        ops = [ReplaceOne(claims.finished_by(sharding.key(doc), doc["fin"]["token"]),
                          claims.finish(now, doc["fin"]["token"], doc.get(PARTITION))) for doc in docs]
        await retrying(lambda _: self.buckets.bulk_write(ops, ordered=False), timeout_s=self.op_timeout_s)

    async def end_copies(self, copies: list[dict], now: dt.datetime, token: str) -> None:
        """End the retry copies ``copies`` (their shard keys) as a purge of ``token``: their tombstones first, so
        that one landing later stores nothing; then those that landed already are marked purged."""
        await self.insert_copies(self.buckets, [{**ref, **claims.finish(now, token, ref[PARTITION])} for ref in copies])
        query, update = {"$or": copies, **LIVE}, purge_mark(now, token)
        await retrying(lambda _: self.buckets.update_many(query, update), timeout_s=self.op_timeout_s)
    # async-only: begin

    # -- schedules (core.schedule): one state document per schedule in ``name.control`` -------------

    async def read_schedule(self, name: str) -> dict | None:
        """The state of the schedule ``name`` (its last tick, and whether it was enqueued), None before its first
        run."""
        return await self.control.find_one(ticks.state_id(name))

    async def claim_tick(self, name: str, prev: dt.datetime | None, tick: dt.datetime, *, sent: bool = False) -> bool:
        """Move the schedule ``name``'s state from its last tick ``prev`` (None: no state yet) on to ``tick``
        (``schedule.claim_update``; ``sent``: a first run's start, which enqueues nothing); False when another
        scheduler moved it first. A retry after a lost reply checks whether the state is the one this claim
        writes: then this claim got through (or another one with the same tick, whose insert is the same
        idempotent one)."""
        state, update = ticks.state_id(name), ticks.claim_update(tick, sent=sent)

        async def op(retry: bool) -> bool:
            if prev is None:
                try:
                    await self.control.insert_one({**state, **update["$set"]})
                    return True
                except DuplicateKeyError:
                    pass
            elif (await self.control.update_one({**state, "tick": prev}, update)).matched_count:
                return True
            return retry and (await self.control.find_one(state)) == {**state, **update["$set"]}

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def mark_tick_sent(self, name: str, tick: dt.datetime) -> None:
        """Record that the schedule ``name``'s ``tick`` is enqueued, if its state is still at that tick."""
        query = {**ticks.state_id(name), "tick": tick}
        await retrying(lambda _: self.control.update_one(query, ticks.sent_update()), timeout_s=self.op_timeout_s)

    # -- the rate limit (core.rate_limit): one counter per window in ``name.rate`` -----------------------

    async def ask_permits(self, window: dt.datetime, k: int) -> int:
        """Ask for ``k`` permits of ``window`` (``rate_limit.ask``: the counter is created by the first ask) and
        return the counter after it. A retry after a lost reply asks again: its permits are counted twice, and
        fewer are granted."""
        update = rate_limit.ask(k)

        async def op(retry: bool) -> int:
            def once() -> Any:
                return self.rate.find_one_and_update({"_id": window}, update, upsert=True,
                                                     return_document=ReturnDocument.AFTER)
            try:
                doc = await once()
            except DuplicateKeyError:  # two first asks raced on the upsert: the counter exists now
                doc = await once()
            return int(doc["n"])

        return await retrying(op, timeout_s=self.op_timeout_s)

    async def reap_windows(self, window: dt.datetime, limit: rate_limit.RateLimit) -> None:
        """Delete the counters of the windows before the one preceding ``window`` (``rate_limit.stale_windows``)."""
        query = rate_limit.stale_windows(window, limit)
        await retrying(lambda _: self.rate.delete_many(query), timeout_s=self.op_timeout_s)

    # async-only: end

"""``AsyncStreamStore``: every command bucketq sends to a stream's collections: ``S`` (buckets and gap markers),
``S.positions`` (the reader groups), ``S.claims`` (the groups' claims of buckets), ``S.seq`` (the sequence
counter and retention floor). The filters and updates come from ``bucketq.core.stream``; this class runs them,
and every command on the buckets collection is a method here. Written async once; ``bucketq.store.sync``'s
``StreamStore`` is generated from it (``devtools/unasync.py``) for the Spark shells' range reads.
"""

from __future__ import annotations

import asyncio  # async-only
import datetime as dt
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from bucketq.core import stream as core
from bucketq.core.format import CLAIMS_SUFFIX, POSITIONS_SUFFIX, SEQ_SUFFIX
from bucketq.core.scans import SCAN
from bucketq.core.stream import GroupState
from bucketq.store.aio.base import collections, insert_new, retrying

# sync: import threading

ALLOCATION_ATTEMPTS = 5


class AsyncStreamStore:
    """As the producer's store it gives each bucket the producer writes its sequence (``write_buckets``)."""

    def __init__(self, database: Any, name: str, *, write_concern: int | str | None = None,
                 op_timeout_s: float = 30.0) -> None:
        self.database = database
        self.name = name
        self.buckets, self.positions, self.claims, self.counter = collections(
            database, name, write_concern, "", POSITIONS_SUFFIX, CLAIMS_SUFFIX, SEQ_SUFFIX)
        self.op_timeout_s = op_timeout_s
        self._allocating = asyncio.Lock()

    async def ensure_indexes(self) -> None:
        await self.buckets.create_index("created")  # reset(at=...)
        await self.claims.create_index([("g", 1), ("e", 1), ("s", 1)])

    async def counter_state(self) -> tuple[int, int]:
        """(last sequence allocated, retention floor): 0 and the first sequence before any write."""
        doc = await self.counter.find_one({"_id": core.COUNTER_ID}) or {}
        return int(doc.get("last", 0)), int(doc.get("floor", core.FIRST_SEQUENCE))

    # -- producer ------------------------------------------------------------------------------------------

    async def write_buckets(self, docs: list[dict]) -> dict[Any, BaseException]:
        """One attempt at the producer's write of sealed buckets, as stream buckets. The first attempt allocates
        their sequences (one ``$inc`` for the whole write) and sets them as the sealed documents' ``_id``, so
        that the pushes resolve to ``"<sequence>:<slot>"``; a retry keeps them. A duplicate counts as stored only
        if it is this producer's own bucket (``b``); a gap marker there fails the bucket for good. Another
        producer's bucket there means the counter handed one sequence out twice, which MongoDB's atomic ``$inc``
        never does (mongo-java-server's findAndModify does, under concurrent requests): the bucket gets a new
        sequence."""
        await self._allocate([d for d in docs if "b" not in d])
        for _attempt in range(ALLOCATION_ATTEMPTS):
            failed = await insert_new(self.buckets, [core.stream_bucket(d) for d in docs],
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

    # -- buckets -------------------------------------------------------------------------------------------

    async def first_pushed_at(self, at: dt.datetime) -> int | None:
        """The sequence of the first bucket opened at or after ``at``; None when there is none."""
        first = await self.buckets.find_one({"created": {"$gte": at}, "gap": {"$ne": True}}, {"_id": 1},
                                            sort=[("_id", 1)])
        return None if first is None else int(first["_id"])

    async def bucket(self, seq: int) -> dict | None:
        return await self.buckets.find_one({"_id": seq})

    async def window(self, start: int, size: int) -> list[dict]:
        """The documents (buckets and gap markers) of sequences ``start`` to ``start + size - 1``, in order, with
        ``_id`` and ``gap`` only."""
        cursor = self.buckets.find({"_id": {"$gte": start, "$lt": start + size}}, {"gap": 1}, sort=[("_id", 1)])
        return [d async for d in cursor]

    async def mark_gap(self, seq: int, now: dt.datetime, owner: str) -> bool:
        """Mark a hole as a gap (docs/FORMAT.md, the hole rule); False when the producer's bucket landed after
        all (a duplicate key)."""
        try:
            await self.buckets.insert_one(core.gap_marker(seq, now, owner))
            return True
        except DuplicateKeyError:
            return False

    async def unread_messages(self, start: int, floor: int) -> int:
        """How many messages the buckets from ``start`` up to (not including) ``floor`` hold."""
        cursor = self.buckets.find({"_id": {"$gte": start, "$lt": floor}, "gap": {"$ne": True}}, {"n": 1})
        return sum([d.get("n", 0) async for d in cursor])

    async def buckets_from(self, start: int) -> list[dict]:
        """The documents from sequence ``start`` on, with what ``core.lag`` needs."""
        return [d async for d in self.buckets.find({"_id": {"$gte": start}}, {"n": 1, "created": 1, "gap": 1})]

    async def count_buckets(self) -> int:
        return await self.buckets.count_documents({}, **SCAN)

    def newest_first(self) -> Any:
        """A cursor over the buckets from the newest back, with what ``core.RetentionCut`` needs."""
        return self.buckets.find({}, {"created": 1, "n": 1, "bytes": 1}, sort=[("_id", -1)])

    async def raise_floor(self, floor: int) -> None:
        await self.counter.update_one(*core.raise_floor(floor))

    async def delete_retired(self, query: dict) -> int:
        """Delete the documents ``core.retired`` names; how many."""
        return (await self.buckets.delete_many(query)).deleted_count

    # -- reader groups and their claims --------------------------------------------------------------------

    async def group(self, name: str) -> GroupState | None:
        doc = await self.positions.find_one({"_id": name})
        return None if doc is None else GroupState.parse(doc)

    async def groups(self) -> list[GroupState]:
        """Every reader group, by name."""
        return [GroupState.parse(doc) async for doc in self.positions.find({}, sort=[("_id", 1)])]

    async def upsert_group(self, query: dict, update: dict) -> None:
        """Create a group or move it (``core.join_group``: only when missing; ``core.reset_update``: always)."""
        await self.positions.update_one(query, update, upsert=True)

    async def move_group(self, query: dict, update: dict) -> bool:
        """A conditional move of a group (``core.commit``, ``core.expire_update``); True when it applied."""
        return (await self.positions.update_one(query, update)).matched_count == 1

    async def delete_group(self, name: str) -> bool:
        """Forget a group and its claims; True if it existed."""
        await self.claims.delete_many({"g": name})
        return (await self.positions.delete_one({"_id": name})).deleted_count == 1

    async def group_claims(self, group: GroupState, start: int, size: int | None, projection: dict) -> list[dict]:
        """The claims of ``group``'s epoch from sequence ``start`` on (``size`` of them at most, when given)."""
        seqs = {"$gte": start} if size is None else {"$gte": start, "$lt": start + size}
        return [c async for c in self.claims.find({"g": group.name, "e": group.epoch, "s": seqs}, projection)]

    async def claim(self, query: dict, update: dict) -> dict | None:
        """Claim a bucket for a reader (``core.claim``); None when another reader holds or finished it. Not
        retried: a claim whose reply was lost expires with its lease."""
        try:
            return await self.claims.find_one_and_update(query, update, upsert=True,
                                                         return_document=ReturnDocument.AFTER)
        except DuplicateKeyError:
            return None

    async def delete_claims(self, query: dict) -> None:
        await self.claims.delete_many(query)

    async def update_claim(self, query: dict, update: dict, *, mine: dict | None = None) -> bool:
        """A write to a claim fenced by the reader's token (``core.claimed_by``); True when applied, False when
        refused (the lease was lost). A retry after an ambiguous error that matches nothing counts as applied
        only if ``mine`` (``core.finished_by``: this token's own finish) matches."""

        async def op(retry: bool) -> bool:
            result = await self.claims.update_one(query, update)
            return result.matched_count == 1 or (
                retry and mine is not None and await self.claims.find_one(mine, {"_id": 1}) is not None)

        return await retrying(op, timeout_s=self.op_timeout_s)

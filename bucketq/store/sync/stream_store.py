# Generated from bucketq/store/aio/stream_store.py by devtools/unasync.py; do not edit.
# Edit the async source and run `python -m devtools.unasync`.
"""``AsyncStreamStore``: every command bucketq sends to a stream's collections: ``S`` (buckets and gap markers),
``S.positions`` (the reader groups), ``S.claims`` (the groups' claims of buckets), ``S.seq`` (the sequence
counter and retention floor). The filters and updates come from the stream modules of ``bucketq.core``
(``stream_format``, ``reader_groups``, ``stream_claims``, ``stream_gaps``, ``stream_retention``); this class runs
them, and every command on the buckets collection is a method here. Written async once; ``bucketq.store.sync``'s
``StreamStore`` is generated from it (``devtools/unasync.py``) for the Spark shells' range reads.

Every command on ``S`` names one partition (``stream_format.Partition``): in a partitioned stream its filter pins
``pt``, the shard key's first field (``stream_format.STREAM_SHARD_KEYS``), so that a mongos targets that partition's
shard; the one exception is ``count_buckets``, an operator's count marked as a scan.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from bucketq.core import reader_groups, stream_claims, stream_format, stream_gaps, stream_retention
from bucketq.core.format import CLAIMS_SUFFIX, POSITIONS_SUFFIX, SEQ_SUFFIX
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.scans import SCAN
from bucketq.core.stream_format import Partition, Position
from bucketq.store.sync.base import collections, insert_new, retrying

ALLOCATION_ATTEMPTS = 5
RECHECK_S = 1.0  # between looks for the layout of a stream that does not exist yet


class StreamStore:
    """As the producer's store it gives each bucket the producer writes its sequence (``write_buckets``), in
    one partition per write, taking the partitions in turn from a random one.

    ``partitions``: what the caller asks for (None: what the stream has, 1 for a new one); ``open`` reads the
    stream's own and refuses a different count."""

    def __init__(self, database: Any, name: str, *, write_concern: int | str | None = None,
                 op_timeout_s: float = 30.0, partitions: int | None = None) -> None:
        self.database = database
        self.name = name
        self.buckets, self.positions, self.claims, self.counter = collections(
            database, name, write_concern, "", POSITIONS_SUFFIX, CLAIMS_SUFFIX, SEQ_SUFFIX)
        self.op_timeout_s = op_timeout_s
        self.wanted = partitions
        self.parts: list[Partition] = []  # the stream's partitions, once ``open``
        self._settled = False  # the stream exists: its partitions cannot change
        self._checked_at = -RECHECK_S  # monotonic time of the last look for the stream's layout
        self._next_part = 0
        self._allocating = threading.Lock()
        self._opening = threading.Lock()

    def open(self) -> list[Partition]:
        """The stream's partitions (``stream_format.stored_partitions``); a new partitioned stream's layout is written.
        Until the stream exists (a layout, or a version-1 counter) this looks again, at most every
        ``RECHECK_S``: a reader started before the stream's first producer learns its partitions once there are
        any."""
        if self._settled or self.parts and time.monotonic() - self._checked_at < RECHECK_S:
            return self.parts
        with self._opening:
            if not self._settled and (not self.parts or time.monotonic() - self._checked_at >= RECHECK_S):
                self._look()
        return self.parts

    @property
    def settled(self) -> bool:
        """Whether the stream exists (its partitions are known for good); until then ``open`` looks again
        at most every ``RECHECK_S``."""
        return self._settled

    def _look(self) -> None:
        """``open``'s look at ``S.seq``."""
        layout = self.counter.find_one({"_id": stream_format.LAYOUT_ID})
        has_counter = layout is None and self.counter.find_one({"_id": stream_format.COUNTER_ID}) is not None
        if layout is None and not has_counter and (self.wanted or 1) > 1:  # a new partitioned stream
            self.counter.update_one(*stream_format.layout_doc(self.wanted or 1), upsert=True)
            layout = self.counter.find_one({"_id": stream_format.LAYOUT_ID})
        count = stream_format.stored_partitions(layout, has_counter, self.wanted)
        if len(self.parts) != count:
            self._next_part = random.randrange(count)
            self.parts = stream_format.partitions_of(count)
        self._settled = layout is not None or has_counter
        self._checked_at = time.monotonic()

    def ensure_indexes(self) -> None:
        parts = self.open()
        if parts[0].partitioned:
            self.buckets.create_index([("pt", 1), ("s", 1)])  # the shard key; ``_id`` makes it unique
            self.buckets.create_index([("pt", 1), ("created", 1)])  # reset(at=...)
            self.claims.create_index([("g", 1), ("e", 1), ("pt", 1), ("s", 1)])
        else:
            self.buckets.create_index("created")  # reset(at=...)
            self.claims.create_index([("g", 1), ("e", 1), ("s", 1)])

    def counters(self) -> dict[int, tuple[int, int]]:
        """By partition: (last sequence allocated, retention floor), 0 and the first sequence before any write."""
        parts = self.open()
        docs = {d["_id"]: d for d in self.counter.find({"_id": {"$in": [p.counter_id for p in parts]}})}
        return {p.number: (int(docs.get(p.counter_id, {}).get("last", 0)),
                           int(docs.get(p.counter_id, {}).get("floor", stream_format.FIRST_SEQUENCE))) for p in parts}

    def counter_state(self, part: Partition) -> tuple[int, int]:
        """(last sequence allocated, retention floor) of ``part``."""
        doc = self.counter.find_one({"_id": part.counter_id}) or {}
        return int(doc.get("last", 0)), int(doc.get("floor", stream_format.FIRST_SEQUENCE))

    # -- producer ------------------------------------------------------------------------------------------

    def write_buckets(self, docs: list[dict]) -> dict[Any, BaseException]:
        """One attempt at the producer's write of sealed buckets, as stream buckets. The first attempt allocates
        their sequences (one ``$inc`` for the whole write) and sets them as the sealed documents' ``_id``, so
        that the pushes resolve to ``"<sequence>:<slot>"``; a retry keeps them. A duplicate counts as stored only
        if it is this producer's own bucket (``b``); a gap marker there fails the bucket for good. Another
        producer's bucket there means the counter handed one sequence out twice, which MongoDB's atomic ``$inc``
        never does (mongo-java-server's findAndModify does, under concurrent requests): the bucket gets a new
        sequence. Failures are keyed by the sealed documents' ``_id`` (then ``Partition.label``)."""
        parts = self.open()
        self._allocate([d for d in docs if "b" not in d])
        failed: dict[Any, BaseException] = {}
        for _attempt in range(ALLOCATION_ATTEMPTS):
            stored = {id(d): stream_format.stream_bucket(d, parts[d["pt"]]) for d in docs}
            failures = insert_new(self.buckets, list(stored.values()), duplicate_is_mine=self._is_mine)
            failed = {d["_id"]: failures[stored[id(d)]["_id"]] for d in docs if stored[id(d)]["_id"] in failures}
            taken = [d for d in docs if d["_id"] in failed and self.buckets.find_one(
                {**parts[d["pt"]].seqs(d["s"]), "gap": {"$ne": True}}, {"_id": 1})]
            if not taken:
                return failed
            for doc in taken:
                doc["_id"] = doc.pop("b")
            self._allocate(taken)
        return failed

    def _allocate(self, fresh: list[dict]) -> None:
        """Give each sealed bucket its sequence, one write's buckets at once, in the order sealed, all in the
        next partition (``pt``, ``s``; its ``_id`` becomes its label, its ObjectId ``b``)."""
        if not fresh:
            return
        with self._allocating:  # writers allocate in the order they start: a producer's order is kept
            part = self.parts[self._next_part]
            self._next_part = (self._next_part + 1) % len(self.parts)
            query, update = stream_format.allocate(part, len(fresh))
            counter = self.counter.find_one_and_update(query, update, upsert=True,
                                                             return_document=ReturnDocument.AFTER)
            self._settled = True  # the counter exists now: the stream does
        first = counter["last"] - len(fresh) + 1
        for offset, doc in enumerate(fresh):
            doc["pt"], doc["s"] = part.number, first + offset
            doc["b"], doc["_id"] = doc["_id"], part.label(first + offset)

    def _is_mine(self, doc: dict) -> bool:
        part = self.parts[doc.get("pt", 0)]
        own = stream_format.own_bucket(part, part.seq_of(doc), doc["b"])
        return self.buckets.find_one(own, {"_id": 1}) is not None

    # -- buckets -------------------------------------------------------------------------------------------

    def first_pushed_at(self, part: Partition, at: dt.datetime) -> int | None:
        """The sequence of the first bucket of ``part`` opened at or after ``at``; None when there is none."""
        query = {"pt": part.number, "created": {"$gte": at}} if part.partitioned else {"created": {"$gte": at}}
        first = self.buckets.find_one({**query, "gap": {"$ne": True}}, {part.seq_field: 1},
                                            sort=[(part.seq_field, 1)])
        return None if first is None else part.seq_of(first)

    def bucket(self, part: Partition, seq: int) -> dict | None:
        return self.buckets.find_one(part.seqs(seq))

    def window(self, part: Partition, start: int, size: int) -> list[dict]:
        """The documents (buckets and gap markers) of ``part``'s sequences ``start`` to ``start + size - 1``, in
        order, with their sequence and ``gap`` only."""
        cursor = self.buckets.find(part.seqs({"$gte": start, "$lt": start + size}), {part.seq_field: 1, "gap": 1},
                                   sort=[(part.seq_field, 1)])
        return [d for d in cursor]

    def mark_gap(self, part: Partition, seq: int, now: dt.datetime, owner: str) -> bool:
        """Mark a hole as a gap (docs/FORMAT.md, the hole rule); False when the producer's bucket landed after
        all (a duplicate key)."""
        try:
            self.buckets.insert_one(stream_gaps.gap_marker(part, seq, now, owner))
            return True
        except DuplicateKeyError:
            return False

    def unread_messages(self, part: Partition, start: int, floor: int) -> int:
        """How many messages the buckets of ``part`` from ``start`` up to (not including) ``floor`` hold."""
        cursor = self.buckets.find({**part.seqs({"$gte": start, "$lt": floor}), "gap": {"$ne": True}}, {"n": 1})
        return sum([d.get("n", 0) for d in cursor])

    def buckets_from(self, part: Partition, start: int) -> list[dict]:
        """The documents of ``part`` from sequence ``start`` on, with what ``stream_stats.Lag`` needs."""
        projection = {part.seq_field: 1, "n": 1, "created": 1, "gap": 1}
        return [d for d in self.buckets.find(part.seqs({"$gte": start}), projection)]

    def count_buckets(self) -> int:
        return self.buckets.count_documents({}, **SCAN)

    def newest_first(self, part: Partition) -> Any:
        """A cursor over the buckets of ``part`` from the newest back, with what ``stream_retention.RetentionCut``
        needs."""
        query = {"pt": part.number} if part.partitioned else {}
        return self.buckets.find(query, {part.seq_field: 1, "created": 1, "n": 1, "bytes": 1},
                                 sort=[(part.seq_field, -1)])

    def raise_floor(self, part: Partition, floor: int) -> None:
        self.counter.update_one(*stream_retention.raise_floor(part, floor))

    def delete_retired(self, part: Partition, floor: int, now: dt.datetime, keep_gaps_s: float) -> int:
        """Delete what retention retires in ``part`` below ``floor`` (``stream_retention.retired``); how many."""
        return (self.buckets.delete_many(stream_retention.retired(part, floor, now, keep_gaps_s))).deleted_count

    # -- reader groups and their claims --------------------------------------------------------------------

    def group(self, name: str) -> ReaderGroup | None:
        doc = self.positions.find_one({"_id": name})
        return None if doc is None else ReaderGroup.parse(doc)

    def groups(self) -> list[ReaderGroup]:
        """Every reader group, by name."""
        return [ReaderGroup.parse(doc) for doc in self.positions.find({}, sort=[("_id", 1)])]

    def upsert_group(self, query: dict, update: dict) -> None:
        """Create a group or move it (``reader_groups.join``: only when missing; ``reader_groups.reset_update``:
        always)."""
        self.positions.update_one(query, update, upsert=True)

    def reset_group(self, name: str, start: list[Position], now: dt.datetime) -> None:
        """Move the group ``name`` to ``start`` in a new epoch, creating it if missing
        (``reader_groups.reset_update``)."""
        self.upsert_group({"_id": name}, reader_groups.reset_update(start, now))

    def move_group(self, query: dict, update: dict) -> bool:
        """A conditional move of a group (``reader_groups.commit``); True when it applied."""
        return (self.positions.update_one(query, update)).matched_count == 1

    def expire_group(self, group: ReaderGroup, part: Partition, floor: int, lost: int, now: dt.datetime) -> bool:
        """Move ``group`` up to the retention ``floor`` of ``part``, counting the ``lost`` messages it never read
        (``stream_retention.expire_update``); True when it applied (the group had not moved meanwhile)."""
        return self.move_group(*stream_retention.expire_update(group, part, floor, lost, now))

    def delete_group(self, name: str) -> bool:
        """Forget a group and its claims; True if it existed."""
        self.claims.delete_many({"g": name})
        return (self.positions.delete_one({"_id": name})).deleted_count == 1

    def claim_leases(self, group: ReaderGroup, part: Partition, start: int, size: int) -> list[dict]:
        """The claims of ``group``'s epoch in ``part`` on the ``size`` sequences from ``start``, as a reader skips
        by them: their sequence, finish and lease."""
        return self._group_claims(group, part, {"$gte": start, "$lt": start + size},
                                        {"s": 1, "fin": 1, "lease": 1})

    def claim_progress(self, group: ReaderGroup, part: Partition, start: int) -> list[dict]:
        """The claims of ``group``'s epoch in ``part`` from sequence ``start`` on, as its lag counts them: their
        sequence, finish and acked slots."""
        return self._group_claims(group, part, {"$gte": start}, {"s": 1, "fin": 1, "done": 1})

    def _group_claims(self, group: ReaderGroup, part: Partition, seqs: dict, projection: dict) -> list[dict]:
        where = {"pt": part.number} if part.partitioned else {}
        return [c for c in self.claims.find({"g": group.name, "e": group.epoch, **where, "s": seqs},
                                                  projection)]

    def claim(self, group: ReaderGroup, part: Partition, seq: int, now: dt.datetime, lease_s: float, token: str,
                    owner: str) -> dict | None:
        """Claim bucket ``seq`` of ``part`` for ``group``'s reader of ``token`` for ``lease_s`` seconds
        (``stream_claims.claim``); None when another reader holds or finished it. Not retried: a claim whose reply
        was lost expires with its lease."""
        query, update = stream_claims.claim(group, part, seq, now, lease_s, token, owner)
        try:
            return self.claims.find_one_and_update(query, update, upsert=True,
                                                         return_document=ReturnDocument.AFTER)
        except DuplicateKeyError:
            return None

    def delete_claims_behind(self, group: ReaderGroup) -> None:
        """Delete ``group``'s claims that count for nothing any more (``stream_retention.claims_behind``)."""
        self.claims.delete_many(stream_retention.claims_behind(group))

    def extend_claim(self, cid: Any, token: str, until: dt.datetime, done: list[int]) -> bool:
        """Record the ``done`` slots of the claim ``cid`` and move its lease's end to ``until``
        (``stream_claims.extend_claim``), if the reader of ``token`` still holds it; True when applied."""
        return self.update_claim(stream_claims.claimed_by(cid, token), stream_claims.extend_claim(until, done))

    def update_claim(self, query: dict, update: dict, *, mine: dict | None = None) -> bool:
        """A write to a claim fenced by the reader's token (``stream_claims.claimed_by``); True when applied, False when
        refused (the lease was lost). A retry after an ambiguous error that matches nothing counts as applied
        only if ``mine`` (``stream_claims.finished_by``: this token's own finish) matches."""

        def op(retry: bool) -> bool:
            result = self.claims.update_one(query, update)
            return result.matched_count == 1 or (
                retry and mine is not None and self.claims.find_one(mine, {"_id": 1}) is not None)

        return retrying(op, timeout_s=self.op_timeout_s)

"""Partitions, the routing unit of a sharded queue (docs/SCALING.md), and the shard keys of its collections.

A bucket carries its partition ``pt``, an int in ``[0, partitions)``: a bucket collection is sharded on
``{pt: 1, _id: 1}`` (immutable fields only), so that every command bucketq sends on it names the shard key: a
claim pins ``pt`` (the chunks of one partition; zones keep a partition on one shard), a fenced write pins
``pt`` and ``_id`` (one document). The tables below are the library's facts about which collections are
sharded and how; the store, the ``bucketq shard`` command and the shard-key test read them. An entry for
another kind of collection set (streams) is one more table row.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from bucketq.core.format import (
    CONTROL_SUFFIX,
    DEAD_SUFFIX,
    GROUPS_SUFFIX,
    INBOX_SUFFIX,
    QUARANTINE_SUFFIX,
    RATE_SUFFIX,
    UNIQUE_SUFFIX,
)
from bucketq.errors import InvalidOption

PARTITION = "pt"  # the field of every bucket and tombstone
MAX_PARTITIONS = 1024

# Queue ``Q``'s collections by suffix: the shard key of each sharded one, or why it stays unsharded (on the
# database's primary shard).
QUEUE_SHARD_KEYS: dict[str, dict[str, Any]] = {
    "": {PARTITION: 1, "_id": 1},  # buckets: claims target one partition, fenced writes one document
}
# Sharded only when it outgrows a shard: its lookups (``_id`` in a set of keys) go to the shards of those keys,
# and its retention delete (by ``at``) goes to every shard.
QUEUE_OPTIONAL_SHARD_KEYS: dict[str, dict[str, Any]] = {INBOX_SUFFIX: {"_id": "hashed"}}
QUEUE_UNSHARDED: dict[str, str] = {
    DEAD_SUFFIX: "failed messages only: small, read by operators (listing, requeue)",
    QUARANTINE_SUFFIX: "unreadable buckets and messages only: small, read by operators",
    CONTROL_SUFFIX: "one document (the pause)",
    GROUPS_SUFFIX: "one counter per partition and one lock per group being served",
    RATE_SUFFIX: "one counter per window of the rate limit, the last two kept",
    UNIQUE_SUFFIX: "one key per unique job pending or in flight, read and written by _id",
}
# Collections whose shard key leads with ``pt`` are split into one zone per partition range.
ZONED = {"": PARTITION}


def check_partitions(partitions: Any) -> bool:
    """Whether ``partitions`` is a valid option value: an int from 1 to ``MAX_PARTITIONS``."""
    return isinstance(partitions, int) and not isinstance(partitions, bool) and 1 <= partitions <= MAX_PARTITIONS


LAYOUT = {"_id": "layout"}  # in ``Q.control``: the queue's partition count, written by its first set-up


def layout_update(wanted: int | None) -> dict[str, Any]:
    """The upsert that stores a queue's partition count unless it is stored already (it never changes): ``wanted``,
    1 when None (a new queue has one partition unless its first client asks for more)."""
    return {"$setOnInsert": {"partitions": wanted or 1}}


def adopted_partitions(layout: dict[str, Any] | None, wanted: int | None) -> int:
    """The queue's partition count: its layout's, else (a queue without one: not created yet, or from before
    layouts, when queues had one partition) ``wanted``, 1 when None. ``InvalidOption`` naming both counts when
    ``wanted`` is not the stored count: a client with another count would claim only some partitions, or write
    buckets no other client claims."""
    stored = (layout or {}).get("partitions")
    if stored is None:
        return wanted or 1
    if wanted is not None and stored != wanted:
        raise InvalidOption(f"the queue has {stored} partitions, this client was opened with partitions="
                            f"{wanted}: every client of a queue uses the queue's count (leave partitions out to "
                            "adopt it; changing it is not supported yet; docs/SCALING.md)")
    return int(stored)


def partition_of(group: str, partitions: int) -> int:
    """The partition of an ordered group: CRC-32 (zlib's, ISO-HDLC) of the group's UTF-8 bytes, as an unsigned
    32-bit number, mod ``partitions`` (docs/FORMAT.md, Partitions): stable across processes and languages."""
    return zlib.crc32(group.encode()) % partitions


def key(doc: Any) -> dict[str, Any]:
    """The shard key of a bucket document (``pt`` and ``_id``): the start of every filter that targets it. A
    bucket written without ``pt`` by an older client has ``pt: None`` here, which matches the missing field (a
    sharded collection routes a missing shard-key field as null)."""
    return {PARTITION: doc.get(PARTITION), "_id": doc["_id"]}


def in_partition(partition: int | None) -> dict[str, Any]:
    """The clause that restricts a bucket query to ``partition``, to merge into a filter (``{**in_partition(p),
    ...}``). Partition 0 also holds the buckets written without ``pt`` (before partitions, or by a writer that
    does not set it): an ``$or`` of two equalities (``pt: null`` matches the missing field, and a sharded
    collection routes a missing shard-key field as null, in zone 0: ``shard_commands``), inside an ``$and`` so
    that it merges with a filter's own ``$or``."""
    if partition:
        return {PARTITION: partition}
    return {"$and": [{"$or": [{PARTITION: 0}, {PARTITION: None}]}]}


def every_partition(query: dict[str, Any], partitions: int) -> dict[str, Any]:
    """``query`` over all partitions, each branch pinning its own: a mongos sends each branch to the shard of
    its partition (and merges the sort), and every branch is served by a ``pt``-prefixed index."""
    if partitions == 1:
        return {**in_partition(0), **query}
    return {"$or": [{**in_partition(p), **query} for p in range(partitions)]}


class Spread:
    """Where a producer's buckets go: ordered groups to ``partition_of(group)``, the others round-robin,
    starting at a random partition (producers started together do not all fill partition 0 first). Held by the
    producer that writes them (``bucketq.shell.producer``, ``bucketq.sync_producer``): the store writes the
    partitions it is given."""

    def __init__(self) -> None:
        self._next: int | None = None  # drawn at the first write: the queue's count is known then

    def assign(self, docs: Sequence[dict[str, Any]], partitions: int) -> None:
        """Give each of ``docs`` without a partition its own among ``partitions`` (the queue's count; a copy
        keeps the one of the bucket it came from)."""
        if self._next is None:
            self._next = random.randrange(partitions)
        for doc in docs:
            if PARTITION in doc:
                continue
            group = doc.get("g")
            if group is not None:
                doc[PARTITION] = partition_of(group, partitions)
            else:
                doc[PARTITION] = self._next % partitions
                self._next = (self._next + 1) % partitions


def assign_by_id(docs: Sequence[dict[str, Any]], partitions: int) -> None:
    """Give each of ``docs`` without a partition the one of its group, else of its ``_id``: for buckets whose
    ``_id`` is the same whoever writes them (an outbox event's, a requeue's): a second writer's insert must reach
    the shard that holds the first, for on a sharded collection ``_id`` is unique within a shard only. No state:
    the same documents get the same partitions in every process."""
    for doc in docs:
        if PARTITION not in doc:
            group = doc.get("g")
            doc[PARTITION] = partition_of(str(doc["_id"]) if group is None else group, partitions)


class Rotation:
    """The order in which a consumer tries partitions: a round tries each one at most once, starting where the
    last successful claim left off plus one, so a busy partition cannot starve the others; the first round
    starts at a random partition (consumers started together do not all contend for partition 0)."""

    def __init__(self) -> None:
        self._start: int | None = None  # drawn at the first round: the queue's count is known then

    def round(self, partitions: int, first: Iterable[int] = ()) -> Iterator[int]:
        """The partitions of one round among ``partitions`` (the queue's count); ``first`` (those a wake-up
        named) before the others."""
        if self._start is None:
            self._start = random.randrange(partitions)
        named = [p for p in dict.fromkeys(first) if 0 <= p < partitions]
        yield from named
        start = self._start
        for i in range(partitions):
            if (partition := (start + i) % partitions) not in named:
                yield partition

    def claimed(self, partition: int) -> None:
        """A claim in ``partition`` took a bucket: the next claim starts at the partition after it."""
        self._start = partition + 1


def shard_commands(db: str, name: str, partitions: int, keys: dict[str, dict[str, Any]] = QUEUE_SHARD_KEYS,
                   zoned: dict[str, str] = ZONED, optional: dict[str, dict[str, Any]] = QUEUE_OPTIONAL_SHARD_KEYS,
                   shards: int | None = None) -> list[str]:
    """The mongosh commands that shard the collections of ``name`` (``keys``: a suffix -> shard key table) and,
    for the zoned ones, pin the ranges of partitions to zones ``<db>.<name>-z<i>``: ``shards`` zones (default one
    per partition), partition ``p`` in zone ``p * shards // partitions``. A zone is given to a shard with
    ``sh.addShardToZone`` (printed commented out: the shard names are the cluster's), as are the optional ones
    (``optional``: collections to shard only when they outgrow a shard)."""
    zones = min(shards or partitions, partitions)
    lines = []
    for suffix, shard_key in keys.items():  # a collection with documents needs the shard key's index first
        lines.append(f"db.getSiblingDB({_js(db)}).getCollection({_js(name + suffix)}).createIndex({_js(shard_key)})")
        lines.append(f"sh.shardCollection({_js(f'{db}.{name}{suffix}')}, {_js(shard_key)})")
    lines += [f"// sh.shardCollection({_js(f'{db}.{name}{suffix}')}, {_js(shard_key)})"
              for suffix, shard_key in optional.items()]
    for suffix, field in zoned.items():
        namespace = f"{db}.{name}{suffix}"
        rest = [k for k in keys[suffix] if k != field]
        for zone in range(zones):
            first = -(-zone * partitions // zones)
            last = -(-(zone + 1) * partitions // zones)
            tag = f"{db}.{name}-z{zone}"
            lines.append(f"// sh.addShardToZone(\"<shard>\", {_js(tag)})")
            # zone 0 starts at MinKey: buckets without ``pt`` (null, which sorts first) are partition 0's
            low = "{" + ", ".join([f"{field}: {first if first else 'MinKey'}", *(f"{k}: MinKey" for k in rest)]) + "}"
            high = "{" + ", ".join([f"{field}: {last}" if last < partitions else f"{field}: MaxKey",
                                    *(f"{k}: MinKey" if last < partitions else f"{k}: MaxKey" for k in rest)]) + "}"
            lines.append(f"sh.updateZoneKeyRange({_js(namespace)}, {low}, {high}, {_js(tag)})")
    return lines


def _js(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k if k.isidentifier() else _js(k)}: {_js(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def audit_keys(name: str, keys: dict[str, dict[str, Any]] = QUEUE_SHARD_KEYS) -> dict[str, str]:
    """``{collection: first shard-key field}`` of the sharded collections of ``name`` (``tests/shardkeys.py``)."""
    return {name + suffix: next(iter(shard_key)) for suffix, shard_key in keys.items()}

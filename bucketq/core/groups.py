"""Ordered groups: the filters and updates of ``Q.groups`` (the queue's counter of places, and one lock document
per group being served) and of a group bucket's order check, yield and hand-off (docs/FORMAT.md, Ordered groups).

A group bucket takes its place ``s`` from the counter when it is written: one atomic document on the server, so
a bucket written after another one's write ended comes after it, whatever the writers' clocks say. The counter
is one for the whole queue, not one per group, so that a group leaves nothing behind in ``Q.groups`` once its
lock is deleted at the end of its turn: many short-lived groups (order ids) do not pile up documents.

A consumer serves a group bucket only while it holds the group's lock and no earlier bucket of the group is
live. The lock expires with the bucket's lease (same ``until``, extended first), so a consumer that crashed
leaves both to expire together. A bucket that must wait is released uncounted and marked ``w`` (waiting). A
consumer that gives the lock back (its turn ended, or it held it only to find an earlier bucket) unlocks, then
reads the group's earliest live bucket and wakes it if it is waiting (hand-off); the earliest bucket, if not
waiting, comes back by itself (its lease or retry time) and hands off in turn. A bucket that yielded to
someone else's lock reads the lock again once marked: if it is free by then, the hand-off may have read the
group before the mark, so it hands off itself. Either way one of the two sees the other: nothing waits for a
timer, which is only the fallback after a crash between two of these writes (``RECHECK``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from bson import ObjectId

from bucketq.core import claims
from bucketq.core.sharding import in_partition

# A waiting bucket comes back by itself this long after it yielded: only a crash between the writes of a yield
# or of a hand-off leaves it to that. Each time it comes back and must wait again costs four round trips (claim,
# lock, release, lock read), so one that already waited comes back less often: a long group (many buckets
# behind the one being served) would otherwise keep the server busy with claims that serve nothing.
RECHECK = dt.timedelta(seconds=10)
RECHECK_AGAIN = dt.timedelta(seconds=30)


# The counter's ``_id``: an int, which no group (a string) can take.
COUNTER_ID = 0


def next_places(count: int, partition: int = 0) -> tuple[dict, dict]:
    """(filter, update) of the upsert that takes the next ``count`` places (the last one is ``seq`` after the
    update) in ``partition``: each partition has its counter, ``_id`` the partition number (partition 0's is the
    counter of a queue without partitions), since a group's buckets are all in its partition. A retry after a lost
    reply takes others: places may have gaps, never repeats."""
    return {"_id": COUNTER_ID + partition}, {"$inc": {"seq": count}}


def acquire(group: str, token: str, until: dt.datetime, bucket_id: ObjectId,
            expired_by: dt.datetime) -> tuple[dict, dict]:
    """(filter, update) of an upsert that takes the lock when it is free, expired by ``expired_by`` (the earliest
    the server's clock can read, as for a claim), or held for this very bucket: the claim of ``bucket_id`` that
    was just made proves that the lease of that holder ended (it crashed, hung, or released the bucket and has
    not unlocked yet), and its later writes are refused by its token. When someone else holds it for another
    bucket, the filter matches nothing and the upsert fails as a duplicate key on ``_id``: not acquired."""
    return ({"_id": group, "$or": [{"token": None}, {"until": {"$lte": expired_by}}, {"bucket": bucket_id}]},
            {"$set": {"token": token, "until": until, "bucket": bucket_id}})


def held_by(group: str, token: str) -> dict:
    """Matches the lock while ``token`` holds it: the only proof that a retried acquire or extension got through,
    and the filter of the unlock (a delete: a free group has no document)."""
    return {"_id": group, "token": token}


def lock_extension(lock_until: dt.datetime, lease_until: dt.datetime, lease_s: float) -> dt.datetime | None:
    """The expiry to extend a lock held until ``lock_until`` to, before the bucket's lease is extended to
    ``lease_until``; None when it already lasts that long. Extended one lease past the lease, so that only
    about every other extension of the lease writes the lock too (a crash can leave the lock up to a lease
    longer than the lease: the next claim of its bucket takes it over, see ``acquire``)."""
    if lock_until >= lease_until:
        return None
    return lease_until + dt.timedelta(seconds=lease_s)


def extend(until: dt.datetime) -> dict:
    """Extend the lock (written, fenced by ``held_by``, before the bucket's lease: ``lock_extension``)."""
    return {"$set": {"until": until}}


def skip(spec: tuple[dict, dict, list], held: list[str]) -> tuple[dict, dict, list]:
    """The claim of ``spec`` without the buckets of the groups in ``held``, whose turn the claimant holds: such a
    bucket could only be released to wait (four round trips for nothing), and a consumer that collects a batch
    while it holds a group's message would keep claiming them instead of handing that message to its handler."""
    if not held:
        return spec
    query, update, sort = spec
    return {**query, "g": {"$nin": held}}, update, sort


def instead(spec: tuple[dict, dict, list], ref: Mapping[str, Any]) -> tuple[dict, dict, list]:
    """The claim of ``spec`` for bucket ``bucket_id`` only: the first live bucket of a group that a claim found
    free while taking a later bucket of it. Without it, claims that take buckets in due order can spend all their
    time on buckets that must wait (after a backlog every waiting bucket is due again), while the group's first
    bucket, the only one that can be served, waits its turn in the same order."""
    query, update, sort = spec
    return {**query, **ref}, update, sort


def earliest_live(group: str, partition: int | None) -> tuple[dict, list]:
    """(filter, sort) of the group's first unfinished bucket (in the group's ``partition``): the only one that
    may be served."""
    return {**in_partition(partition), "g": group, **claims.LIVE}, [("s", 1)]


def wait_release(now: dt.datetime, token: str, *, again: bool = False) -> dict:
    """Release a bucket that must wait for its group: uncounted (no tries added), marked waiting for a
    hand-off, and due ``RECHECK`` from now should none come (``RECHECK_AGAIN`` when it was waiting already)."""
    update = claims.release(now, token, due=now + (RECHECK_AGAIN if again else RECHECK))
    update["$set"]["w"] = True
    return update


def release(now: dt.datetime, token: str, done: list[int], *, due: dt.datetime | None,
            retry_slot: int | None) -> dict:
    """Release a group bucket that was served: uncounted; a nacked slot (``retry_slot``) gets its try added
    in ``t`` and holds the bucket, hence its group, until ``due``, its retry time. Not waiting: only its own
    due time brings it back (a hand-off must not cut a nack's backoff short)."""
    update = claims.release(now, token, done, due=due)
    if retry_slot is not None:
        update["$inc"][f"t.{retry_slot}"] = 1
    update["$unset"] = {"w": ""}
    return update


def waiting(first: Mapping[str, Any]) -> bool:
    """Whether the group's earliest live bucket ``first`` waits for a hand-off (else it comes back by itself)."""
    return bool(first.get("w")) and first.get("lease") is None


def free(lock: dict | None, expired_by: dt.datetime) -> bool:
    """Whether a lock document (or its absence) leaves the group free to take (``expired_by``: as for ``acquire``)."""
    return lock is None or lock.get("token") is None or (lock.get("until") is not None and lock["until"] <= expired_by)


def wake(ref: Mapping[str, Any], now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update) of the hand-off: the waiting bucket (shard key ``ref``) becomes due now, unless claimed
    meanwhile."""
    return {**ref, "w": True, "lease": None}, {"$set": {"due": now}, "$unset": {"w": ""}}

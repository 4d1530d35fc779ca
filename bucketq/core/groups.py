"""Ordered groups: the filters and updates of the group's document in ``Q.groups`` (its order counter and its
lock) and of a group bucket's order check, yield and hand-off (docs/FORMAT.md, Ordered groups).

A group bucket takes its place ``s`` from the group's counter when it is written: the counter is one atomic
document on the server, so a bucket written after another one's write ended comes after it, whatever the
writers' clocks say.

A consumer serves a group bucket only while it holds the group's lock and no earlier bucket of the group is
live. The lock expires with the bucket's lease (same ``until``, extended first), so a consumer that crashed
leaves both to expire together. A bucket that must wait is released uncounted and marked ``w`` (waiting); the
consumer that ends its turn with the group unlocks, then wakes the earliest waiting one (hand-off). A bucket that
yielded to the lock reads the lock again once marked: if it is free by then, the hand-off may have run before
the mark, so it wakes the earliest waiting bucket itself. Either way one of the two sees the other.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from bson import ObjectId

from bucketq.core import claims

# A waiting bucket comes back at its blocker's due time, within these bounds: never at once (no busy loop
# while its blocker is claimable but not yet claimed), and at most this late, should its hand-off have come
# before it was marked waiting.
RECHECK_MIN = dt.timedelta(seconds=0.1)
RECHECK_MAX = dt.timedelta(seconds=5)


def next_place(group: str) -> tuple[dict, dict]:
    """(filter, update) of the upsert that takes the group's next place (``seq``, returned after the update).
    A retry after a lost reply takes another one: places may have gaps, never repeats."""
    return {"_id": group}, {"$inc": {"seq": 1}}


def acquire(group: str, token: str, until: dt.datetime, bucket_id: ObjectId,
            now: dt.datetime) -> tuple[dict, dict]:
    """(filter, update) of an upsert that takes the lock when it is free or expired. When someone else holds
    it, the filter matches nothing and the upsert fails as a duplicate key on ``_id``: not acquired."""
    return ({"_id": group, "$or": [{"token": None}, {"until": {"$lte": now}}]},
            {"$set": {"token": token, "until": until, "bucket": bucket_id}})


def held_by(group: str, token: str) -> dict:
    """Matches the lock while ``token`` holds it: the only proof that a retried acquire or extension got through."""
    return {"_id": group, "token": token}


def extend(until: dt.datetime) -> dict:
    """Extend the lock to the bucket's new lease expiry (written, fenced by ``held_by``, before the bucket's)."""
    return {"$set": {"until": until}}


UNLOCK = {"$set": {"token": None, "until": None, "bucket": None}}


def earlier_live(group: str, place: int) -> dict:
    """A bucket of the group before ``place`` and not finished: the bucket at ``place`` must wait for it."""
    return {"g": group, "s": {"$lt": place}, **claims.LIVE}


def recheck_at(now: dt.datetime, blocker_due: dt.datetime | None) -> dt.datetime:
    """When a waiting bucket comes back by itself: when its blocker can be done (its ``due``: lease expiry or
    retry time; the lock's ``until``), bounded by ``RECHECK_MIN`` and ``RECHECK_MAX``."""
    wait = RECHECK_MAX if blocker_due is None else blocker_due - now
    return now + min(RECHECK_MAX, max(RECHECK_MIN, wait))


def wait_release(now: dt.datetime, token: str, due: dt.datetime) -> dict:
    """Release a bucket that must wait for its group: uncounted (no tries added), due at ``due``, marked
    waiting so that the group's hand-off wakes it earlier."""
    update = claims.release(now, token, due=due)
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


def waiting(group: str, before: int | None = None) -> dict:
    """The unclaimed buckets of the group waiting for their turn (see ``wake``); only those ``before`` the place
    of a bucket that yields to an earlier one, which must not wake itself."""
    query: dict[str, Any] = {"g": group, "w": True, "lease": None}
    if before is not None:
        query["s"] = {"$lt": before}
    return query


def free(lock: dict | None, now: dt.datetime) -> bool:
    """Whether a lock document (or its absence) leaves the group free to take."""
    return lock is None or lock.get("token") is None or (lock.get("until") is not None and lock["until"] <= now)


def wake(now: dt.datetime) -> tuple[dict, list]:
    """(update, sort) of the hand-off: the earliest waiting bucket of the group becomes due now."""
    update: dict[str, Any] = {"$set": {"due": now}, "$unset": {"w": ""}}
    return update, [("s", 1)]

"""The ``stats()`` aggregation: one pass over the bucket collection, counting unfinished messages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from bucketq.core.claims import LIVE
from bucketq.core.format import MAX_BUCKET_SIZE, as_utc
from bucketq.core.priorities import PRIORITY, is_priority
from bucketq.core.strays import claimable

# Dates a real ``created`` lies between; in BSON's order across types, other types fall outside.
_EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_LATEST = dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)

# A bucket's messages left, ``n - |done|``: 0 for a malformed document (a string ``n`` would make ``$subtract``
# raise, and one bad document must not fail the whole aggregation). ``$ifNull`` although ``done`` was just found an
# array: the test server evaluates a ``$project`` on the live document, which a finish in another thread can turn
# into a tombstone (no ``done``) between the test and the ``$size``; a real MongoDB reads a snapshot.
_COUNTED = {"$and": [{"$gte": ["$n", 1]}, {"$lte": ["$n", MAX_BUCKET_SIZE]}, {"$isArray": "$done"}]}
_LEFT = {"$cond": [_COUNTED, {"$subtract": ["$n", {"$size": {"$ifNull": ["$done", []]}}]}, 0]}
_LEASED = {"$ne": [{"$ifNull": ["$lease", None]}, None]}

STATS_KEYS = ("ready", "scheduled", "in_flight", "dead", "quarantined", "buckets", "oldest_ready_age_s",
              "ready_by_priority")


def stats_pipeline(now: dt.datetime, partitions: int) -> list[dict[str, Any]]:
    """Messages left per bucket (``n - |done|``), summed by state and priority level (a row per level stored, in
    the same pass: ``shape_stats`` adds them up). A claimed bucket's ``due`` is its lease
    expiry, so "claimed and due later" is in flight, and an expired lease counts as ready again.
    Tombstones are left out, and so are the documents no claim can take (``core.strays``: counted apart, as not
    buckets). A malformed document counts as a bucket with no messages (``_LEFT``)."""
    is_due = {"$lte": ["$due", now]}
    dated = {"$and": [{"$gte": ["$created", _EARLIEST]}, {"$lte": ["$created", _LATEST]}]}
    return [
        {"$match": {**LIVE, **claimable(partitions)}},
        {"$project": {"left": _LEFT, "is_due": is_due, "leased": _LEASED, PRIORITY: 1,
                      "created": {"$cond": [dated, "$created", None]}}},
        {"$group": {
            "_id": f"${PRIORITY}",
            "buckets": {"$sum": 1},
            "ready": {"$sum": {"$cond": ["$is_due", "$left", 0]}},
            "scheduled": {"$sum": {"$cond": [{"$or": ["$is_due", "$leased"]}, 0, "$left"]}},
            "in_flight": {"$sum": {"$cond": [{"$and": [{"$not": ["$is_due"]}, "$leased"]}, "$left", 0]}},
            "oldest_ready": {"$min": {"$cond": ["$is_due", "$created", None]}},
        }},
        {"$sort": {"_id": -1}},  # highest level first: the same rows in the same order on every server
    ]


# What an ordered group with messages left waits for, by the state of its first live bucket (the only one that
# may be served; docs/FORMAT.md, Ordered groups):
GROUP_STATES = (
    "served",   # a consumer holds its turn (lease live): it waits for that consumer's ack of the message in hand
    "ready",    # due and unclaimed, or its holder's lease expired: it waits for a consumer to claim it
    "retry",    # a nacked message holds it back: it waits for that message's retry time
    "waiting",  # it yielded to the group's lock: it waits for a hand-off, or its recheck time should none come
)


def groups_pipeline(now: dt.datetime) -> list[dict[str, Any]]:
    """Ordered groups by what they wait for (``GROUP_STATES``): the first live bucket of each group, in place
    order, classified; then per state the number of groups, their messages left, and the latest ``due``
    among their first buckets (the latest lease expiry, retry time or recheck). Reads group buckets only."""
    state = {"$cond": [{"$and": ["$leased", {"$gt": ["$due", now]}]}, "served",
                       {"$cond": [{"$lte": ["$due", now]}, "ready", {"$cond": ["$w", "waiting", "retry"]}]}]}
    return [
        {"$match": {"g": {"$exists": True}, **LIVE}},
        {"$sort": {"g": 1, "s": 1}},
        {"$project": {"g": 1, "due": 1, "leased": _LEASED, "w": {"$eq": ["$w", True]}, "left": _LEFT}},
        {"$group": {"_id": "$g", "due": {"$first": "$due"}, "leased": {"$first": "$leased"}, "w": {"$first": "$w"},
                    "left": {"$sum": "$left"}}},
        {"$project": {"state": state, "due": 1, "left": 1}},
        {"$group": {"_id": "$state", "groups": {"$sum": 1}, "messages": {"$sum": "$left"}, "until": {"$max": "$due"}}},
    ]


def shape_groups(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{state: {"groups", "messages", "until"}}`` for every state of ``GROUP_STATES`` (``until``: None when
    no group is in that state; for "ready", the latest due time passed)."""
    found = {row.get("_id"): row for row in rows}
    out = {}
    for state in GROUP_STATES:
        row = found.get(state, {})
        until = row.get("until")
        out[state] = {"groups": int(row.get("groups", 0)), "messages": int(row.get("messages", 0)),
                      "until": as_utc(until) if isinstance(until, dt.datetime) else None}
    return out


def shape_stats(rows: Sequence[Mapping[str, Any]], *, dead: int, quarantined: int, now: dt.datetime) -> dict[str, Any]:
    """The keys of ``STATS_KEYS`` from the rows of ``stats_pipeline``, one per priority level stored: their sums,
    and ``ready_by_priority``, ``{level: ready messages}`` for each level with any, highest first. A level that
    is not one (a malformed ``pr``) counts as 0, as claims take it."""
    by_level: dict[int, int] = {}
    for row in rows:
        level = row["_id"] if is_priority(row.get("_id")) else 0
        by_level[level] = by_level.get(level, 0) + int(row.get("ready", 0))
    oldest = min((row["oldest_ready"] for row in rows if isinstance(row.get("oldest_ready"), dt.datetime)),
                 default=None)
    return {
        "ready": sum(int(row.get("ready", 0)) for row in rows),
        "scheduled": sum(int(row.get("scheduled", 0)) for row in rows),
        "in_flight": sum(int(row.get("in_flight", 0)) for row in rows),
        "dead": dead,
        "quarantined": quarantined,
        "buckets": sum(int(row.get("buckets", 0)) for row in rows),
        "oldest_ready_age_s": max(0.0, (now - as_utc(oldest)).total_seconds()) if oldest is not None else 0.0,
        "ready_by_priority": {level: n for level, n in sorted(by_level.items(), reverse=True) if n},
    }

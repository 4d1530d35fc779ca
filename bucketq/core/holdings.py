"""Who holds what in a queue, sans-I/O: the buckets under a live lease and the ordered groups being served,
by the holder each lease records (``lease.owner``, ``host:pid``: docs/FORMAT.md). A group's lock names the bucket
it serves and that bucket's lease token, not a holder: its holder is the owner of that lease."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from bucketq.core.operator_writes import unfinished_messages

UNKNOWN_HOLDER = "(lease ended)"  # a lock whose bucket is no longer held under the lock's token


def by_holder(buckets: Iterable[Mapping[str, Any]], locks: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{owner: {buckets, messages, until, groups}}`` from the held buckets and live group locks that
    ``QueueStore.held`` read: ``messages`` the unfinished ones of the held buckets, ``until`` the latest lease
    expiry, ``groups`` the locks held as ``[{group, until}]``. Sorted by holder."""
    holders: dict[str, dict[str, Any]] = {}
    owner_of_token: dict[Any, str] = {}

    def row(owner: str) -> dict[str, Any]:
        return holders.setdefault(owner, {"buckets": 0, "messages": 0, "until": None, "groups": []})

    for doc in buckets:
        lease = doc.get("lease")
        if not isinstance(lease, Mapping):
            continue
        owner = str(lease.get("owner") or "(no owner recorded)")
        owner_of_token[lease.get("token")] = owner
        held = row(owner)
        held["buckets"] += 1
        held["messages"] += unfinished_messages(doc)
        held["until"] = _later(held["until"], doc.get("due"))
    for lock in locks:
        owner = owner_of_token.get(lock.get("token"), UNKNOWN_HOLDER)
        row(owner)["groups"].append({"group": lock.get("_id"), "until": lock.get("until")})
    for held in holders.values():
        held["groups"].sort(key=lambda g: str(g["group"]))
    return dict(sorted(holders.items()))


def _later(a: dt.datetime | None, b: Any) -> dt.datetime | None:
    if not isinstance(b, dt.datetime):
        return a
    return b if a is None or b > a else a

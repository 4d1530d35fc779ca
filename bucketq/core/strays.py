"""Documents in a queue's collection that no claim can take, sans I/O (docs/FORMAT.md, "Documents no claim can take").

A claim matches ``{pt: P, due: {$lte: now}, ...}`` (``core.claims``): a document whose ``due`` is not a date (or is
missing) or whose ``pt`` is no partition of the queue is never claimed, so no consumer ever quarantines it, and
``stats()`` would count it as a bucket forever. (Any other mistyped field is the claim's to find: a claimed document
that ``parse_bucket`` refuses is quarantined, and one whose ``c`` the claim cannot increment is claimed without it,
``claims.claim_uncounted``.) Such a *stray* is either a broken
bucket, one with the format's version field ``v``, which housekeeping moves to quarantine with the reason, or not a
bucket at all (an application's own document in the queue's collection, written by mistake), which is left as it
is and reported as "not a bucket" by ``stats()``, ``bucketq peek`` and the dashboard.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from bson import Decimal128

from bucketq.core.claims import LIVE
from bucketq.core.sharding import PARTITION, in_partition

VERSION = "v"  # the format's version field: a document that has it was written as a bucket
BROKEN = {VERSION: {"$exists": True}}  # strays to quarantine; the others are not buckets
MAX_LISTED_VALUE = 60  # characters of a field's value quoted in a reason


def strays(partitions: int) -> dict[str, Any]:
    """The live documents no claim can take: in each partition those whose ``due`` is not a date, and those in no
    partition. Each branch is a range of the ``{pt: 1, due: 1}`` index, so that on MongoDB the look reads the
    strays only, not the collection (the test server ignores that index: there it is a scan)."""
    return {**LIVE, "$or": [*({**in_partition(p), "due": {"$not": {"$type": "date"}}} for p in range(partitions)),
                            {PARTITION: {"$nin": [None, *range(partitions)]}}]}


DATED = {"due": {"$type": "date"}}  # leaves strays out of a query that pins a partition, merged into it (``peek``)


def claimable(partitions: int) -> dict[str, Any]:
    """The clauses that leave strays out of a query over every partition (``stats()``), to merge into it."""
    return {**DATED, PARTITION: {"$in": [None, *range(partitions)]}}


def problems(doc: Mapping[str, Any], partitions: int) -> list[str]:
    """Why no claim can take ``doc``, one phrase per field (``branches``, read in Python); [] when a claim can."""
    found = []
    if not isinstance(doc.get("due"), dt.datetime):
        found.append("due is missing" if "due" not in doc else f"due is {_shown(doc['due'])}, not a date")
    pt = doc.get(PARTITION)
    if pt is not None and not (_is_number(pt) and pt in range(partitions)):
        found.append(f"{PARTITION} is {_shown(pt)}, not a partition of the queue (0 to {partitions - 1})")
    return found


def reason(doc: Mapping[str, Any], partitions: int) -> str:
    """A stray's reason, for its quarantine entry or its report: what no claim matches, and whether it is a bucket."""
    what = "a bucket no claim can take" if VERSION in doc else f"not a bucket (no format version {VERSION!r})"
    return f"{what}: {'; '.join(problems(doc, partitions)) or 'claimable now'}"


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= MAX_LISTED_VALUE else text[:MAX_LISTED_VALUE] + '...'}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool)

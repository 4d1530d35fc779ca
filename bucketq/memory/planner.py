"""Whether a declared index serves a query: the in-memory database's ``notablescan`` mode.

MongoDB's ``notablescan`` server parameter refuses any query that only a collection scan can answer. Here a
query (a filter, with the sort it asks for) is served when some index of the collection bounds it, walking the
index's keys as MongoDB's planner can use them: equality predicates on a prefix of the keys, then the sort on the
next keys (in the index's direction or the reverse), then a range on the next key. An index serves the query
when that walk uses at least one key; a top-level ``$or`` is served when the rest of the filter is, or when
every one of its branches is. A sparse index serves only predicates that cannot match a missing field.

Whole-collection reads that an operator asks for carry the comment ``bucketq.core.scans.SCAN_COMMENT``; the
collection's ``_plan`` lets them through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_EQUALITY = frozenset({"$eq", "$in"})
_RANGE = frozenset({"$gt", "$gte", "$lt", "$lte"})


def _predicates(query: Mapping[str, Any]) -> tuple[dict[str, str], list[list[Mapping[str, Any]]]]:
    """``{field: "eq" | "range" | "other"}`` of the filter's top-level clauses (``$and`` flattened), and its
    ``$or`` branch lists."""
    kinds: dict[str, str] = {}
    ors: list[list[Mapping[str, Any]]] = []
    for key, spec in query.items():
        if key == "$and":
            for clause in spec:
                more, more_ors = _predicates(clause)
                kinds = _merged(kinds, more)
                ors.extend(more_ors)
        elif key == "$or":
            ors.append(list(spec))
        elif not key.startswith("$"):
            kinds[key] = _stronger(kinds.get(key), _kind(spec))
    return kinds, ors


def _kind(spec: Any) -> str:
    if not (isinstance(spec, Mapping) and spec and next(iter(spec)).startswith("$")):
        return "null" if spec is None else "eq"
    if any(op in _EQUALITY for op in spec) and spec.get("$eq", 0) is not None:
        return "eq"
    if any(op in _RANGE for op in spec):
        return "range"
    return "exists" if spec.get("$exists") is True else "other"


def _merged(kinds: Mapping[str, str], more: Mapping[str, str]) -> dict[str, str]:
    """The clauses of both filters on each field, as the stronger of the two."""
    out = dict(kinds)
    for field, kind in more.items():
        out[field] = _stronger(out.get(field), kind)
    return out


def _stronger(a: str | None, b: str) -> str:
    order = ("other", "null", "exists", "range", "eq")
    return b if a is None or order.index(b) > order.index(a) else a


def _uses(keys: Sequence[tuple[str, int]], sparse: bool, kinds: Mapping[str, str],
          sort: Sequence[tuple[str, int]]) -> bool:
    """Whether an index of ``keys`` bounds the filter whose clauses are ``kinds``, or gives its ``sort``."""
    if sparse and kinds.get(keys[0][0]) not in ("eq", "range", "exists"):
        return False  # a sparse index leaves out the documents that lack its field: a scan would be needed
    i = 0
    while i < len(keys) and kinds.get(keys[i][0]) in ("eq", "null"):
        i += 1
    used = i > 0
    rest = [s for s in sort if kinds.get(s[0]) not in ("eq", "null")]
    window = list(keys[i:i + len(rest)])
    if rest and len(window) == len(rest) and [k for k, _ in window] == [k for k, _ in rest]:
        same = all(d == w for (_, d), (_, w) in zip(rest, window, strict=True))
        reverse = all(d == -w for (_, d), (_, w) in zip(rest, window, strict=True))
        if same or reverse:
            i, used = i + len(rest), True
    return used or (i < len(keys) and kinds.get(keys[i][0]) in ("range", "exists"))


def served(query: Mapping[str, Any], sort: Sequence[tuple[str, int]],
           indexes: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether some index of ``indexes`` (``index_information()``'s shape) serves ``query`` sorted by ``sort``."""
    return _served(*_predicates(query), sort, indexes)


def _served(kinds: dict[str, str], ors: list[list[Mapping[str, Any]]], sort: Sequence[tuple[str, int]],
            indexes: Mapping[str, Mapping[str, Any]]) -> bool:
    if any(_uses(i["key"], bool(i.get("sparse")), kinds, sort) for i in indexes.values()):
        return True
    if not ors:
        return False
    first, *others = ors
    for branch in first:  # an OR plan: every branch, with the rest of the filter, on an index of its own
        more, more_ors = _predicates(branch)
        if not _served(_merged(kinds, more), others + more_ors, sort, indexes):
            return False
    return True


def describe(indexes: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{name} {dict(i['key'])}{' sparse' if i.get('sparse') else ''}" for name, i in indexes.items())

"""Priorities (docs/guide/priorities.md; docs/FORMAT.md, Claims and leases): a message's level, from 0 (the default) to
``MAX_PRIORITY``, higher served first. A bucket holds messages of one level, stored as its ``pr`` only above 0, so
that a default bucket is the same document as before priorities.

Claims take the due bucket of the highest level first, then the oldest. So that lower levels are never starved by a
steady backlog of higher ones, a claimant takes every ``fairness``-th bucket by age alone (``Turns``): the oldest
due bucket whatever its level, which serves the queue in due order at ``1/fairness`` of the claims at least.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bucketq.errors import InvalidOption

PRIORITY = "pr"  # the bucket's field
MAX_PRIORITY = 9
DEFAULT_FAIRNESS = 8
MAX_FAIRNESS = 1000

# Claim orders: the priority claim and the claim by age (the one before priorities). A missing ``pr`` (level 0) is
# null, which sorts below every number.
BY_PRIORITY = [(PRIORITY, -1), ("due", 1)]
BY_AGE = [("due", 1)]


def is_priority(value: Any) -> bool:
    """Whether ``value`` is a level: an int (not a bool) from 0 to ``MAX_PRIORITY``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PRIORITY


def check_priority(priority: Any) -> int:
    """``priority`` as a push takes it: an int from 0 to ``MAX_PRIORITY``, else ``InvalidOption``."""
    if not is_priority(priority):
        raise InvalidOption(f"priority must be an int from 0 to {MAX_PRIORITY}, got {priority!r:.60}")
    return priority


def check_fairness(fairness: Any) -> int:
    """``priority_fairness``: an int from 0 (strict priorities: lower levels wait while higher ones are due) to
    ``MAX_FAIRNESS``, else ``InvalidOption``."""
    if not isinstance(fairness, int) or isinstance(fairness, bool) or not 0 <= fairness <= MAX_FAIRNESS:
        raise InvalidOption(f"priority_fairness must be an int from 0 (strict priorities) to {MAX_FAIRNESS}, "
                            f"got {fairness!r:.60}")
    return fairness


def stored_priority(doc: Mapping[str, Any]) -> int:
    """The level a stored bucket or entry records (``pr``); 0 when it has none, or one that is not a level."""
    level = doc.get(PRIORITY, 0)
    return level if is_priority(level) else 0


class Turns:
    """Which claims of one claimant go by age: after ``fairness - 1`` buckets taken by priority, claims go by age
    until one takes a bucket. So of any ``fairness`` buckets a claimant takes in a row, one at least is the oldest
    due bucket of its partition, whatever its level. ``fairness`` 0: never by age; 1: always (priorities ignored)."""

    def __init__(self, fairness: int = DEFAULT_FAIRNESS) -> None:
        self.fairness = check_fairness(fairness)
        self._by_priority = 0  # buckets taken by priority since the last one taken by age

    @property
    def by_age(self) -> bool:
        return self.fairness > 0 and self._by_priority >= self.fairness - 1

    def sort(self) -> list[tuple[str, int]]:
        """The order of the next claim."""
        return BY_AGE if self.by_age else BY_PRIORITY

    def took(self, sort: list[tuple[str, int]]) -> None:
        """A claim in ``sort`` order took a bucket."""
        self._by_priority = 0 if sort is BY_AGE else self._by_priority + 1

"""A queue's rate limit, sans I/O: at most ``limit`` messages served per window of ``per`` seconds, across every
consumer of the queue.

Windows are fixed spans of the server's clock, one counter document each in ``Q.rate``:
``{_id: <window start, a date>, n: <permits asked for>}`` (docs/FORMAT.md, "Rate limit"). A consumer asks for
``k`` permits with one ``$inc`` upsert and is granted what was left of the window when its increment landed:
the counter may run past the limit (every ask adds to it), the grants never do. An ask retried after a lost
reply adds twice and is granted less: a lost reply can waste permits, never exceed the limit.

The limit itself is stored with the queue, in its layout document (``Q.control``, field ``rate_limit``) next to the
partition count: the first consumer that names one stores it, a consumer that names another is refused, and one
that names none adopts it, so that every consumer of a queue counts against the same limit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bucketq.core.format import MAX_COUNT, UTC
from bucketq.errors import InvalidOption

EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MIN_PER_S, MAX_PER_S = 0.01, 86400.0
# A consumer asks for up to this share of a window's permits at a time: one command per chunk, not per message;
# what it does not spend before the window ends is lost to the others, so the share stays small.
CHUNK_SHARE = 16
MAX_CHUNK = 1000


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` messages served per ``per`` seconds by all the consumers of a queue together (windows of
    the server's clock, so at most ``2 * limit`` in any span of ``per`` seconds that straddles two windows)."""

    limit: int
    per: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_COUNT:
            raise InvalidOption(f"rate limit must be an int from 1 to {MAX_COUNT}, got {self.limit!r}")
        if (not isinstance(self.per, (int, float)) or isinstance(self.per, bool)
                or not MIN_PER_S <= self.per <= MAX_PER_S):
            raise InvalidOption(f"rate limit per must be between {MIN_PER_S} and {MAX_PER_S:.0f} seconds, "
                                f"got {self.per!r}")

    @property
    def per_ms(self) -> int:
        """The window's length, ``per``, in whole milliseconds."""
        return round(self.per * 1000)

    def window(self, now: dt.datetime) -> dt.datetime:
        """The start of the window ``now`` is in: a multiple of ``per`` since the epoch, to the millisecond."""
        ms = (now - EPOCH) // dt.timedelta(milliseconds=1)
        return EPOCH + dt.timedelta(milliseconds=ms - ms % self.per_ms)

    def window_end(self, start: dt.datetime) -> dt.datetime:
        """The end of the window that begins at ``start`` (the start of the next one)."""
        return start + dt.timedelta(milliseconds=self.per_ms)

    def chunk(self, wanted: int) -> int:
        """How many permits to ask for when ``wanted`` are wanted now: those, or a share of the window's to serve
        the next messages from, whichever is more (within the limit and ``MAX_CHUNK``)."""
        return max(1, min(max(wanted, self.limit // CHUNK_SHARE), self.limit, MAX_CHUNK))


STORED = "rate_limit"  # the field of the queue's layout document (``Q.control``) that holds its limit


def store(limit: RateLimit) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) that stores ``limit`` in the queue's layout document unless one is stored already."""
    return {STORED: {"$exists": False}}, {"$set": {STORED: {"limit": limit.limit, "per": float(limit.per)}}}


def adopted(layout: Mapping[str, Any] | None, wanted: RateLimit | None) -> RateLimit | None:
    """The queue's rate limit: the one its layout stores, else ``wanted`` (None: no limit). ``InvalidOption``
    naming both when ``wanted`` is another: consumers with different limits would each enforce their own."""
    stored = (layout or {}).get(STORED)
    if stored is None:
        return wanted
    try:
        limit = RateLimit(stored["limit"], stored["per"])
    except (InvalidOption, KeyError, TypeError) as exc:
        raise InvalidOption(f"the queue's stored rate limit {stored!r} is not valid: {exc}") from None
    if wanted is not None and (wanted.limit, wanted.per_ms) != (limit.limit, limit.per_ms):
        raise InvalidOption(f"the queue's rate limit is {describe(limit)}, this consumer was opened with "
                            f"rate_limit={describe(wanted)}: every consumer of a queue counts against the queue's "
                            "limit (leave rate_limit out to adopt it; docs/FORMAT.md, Rate limit)")
    return limit


def describe(limit: RateLimit) -> str:
    """``RateLimit(limit, per=seconds)``, as a user writes it."""
    return f"RateLimit({limit.limit}, per={limit.per:g})"


def ask(k: int) -> dict[str, Any]:
    """The update of an ask for ``k`` permits (an upsert on the window's ``_id``)."""
    return {"$inc": {"n": k}}


def granted(counter_after: int, k: int, limit: int) -> int:
    """Permits granted to an ask of ``k`` whose increment left the window's counter at ``counter_after``."""
    return max(0, min(k, limit - (counter_after - k)))


def first_ask(counter_after: int, k: int) -> bool:
    """Whether this ask opened the window (its increment is the whole counter): its consumer reaps old windows."""
    return counter_after == k


def stale_windows(start: dt.datetime, limit: RateLimit) -> dict[str, Any]:
    """The windows before the one preceding ``start``: kept one window longer for readers with a slower clock."""
    return {"_id": {"$lt": start - dt.timedelta(milliseconds=limit.per_ms)}}

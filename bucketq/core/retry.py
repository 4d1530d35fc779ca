"""Retrying server operations: which errors may be retried, and how long to wait between attempts.

Both shells (the async ``store.retrying`` and the sync batch shell) run this one policy; only the sleep
differs. A transient error is one after which the operation may or may not have been applied, so a retry
is told (``retry=True``) and must be idempotent.
"""

from __future__ import annotations

import random

from pymongo.errors import ConnectionFailure, DocumentTooLarge, OperationFailure, PyMongoError

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0


def is_transient(exc: BaseException) -> bool:
    """Errors after which the operation may or may not have been applied, and a retry may succeed."""
    if isinstance(exc, ConnectionFailure):  # includes AutoReconnect, NetworkTimeout, NotPrimaryError
        return True
    return isinstance(exc, PyMongoError) and exc.has_error_label("RetryableWriteError")


# Server codes of a write whose document would exceed 16 MiB: BSONObjectTooLarge, and an update's result too large.
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})


def is_too_large(exc: BaseException) -> bool:
    """A write refused because a document would exceed 16 MiB: the same write will never succeed."""
    return isinstance(exc, DocumentTooLarge) or (isinstance(exc, OperationFailure) and exc.code in TOO_LARGE_CODES)


class RetrySchedule:
    """The waits between the attempts of one operation: exponential from ``FIRST_DELAY_S`` to
    ``MAX_DELAY_S`` with jitter, while the next attempt would start within ``timeout_s`` of the first."""

    def __init__(self, timeout_s: float, started_mono: float, rng: random.Random | None = None) -> None:
        self._deadline = started_mono + timeout_s
        self._delay = FIRST_DELAY_S
        self._rng = rng or random.Random()

    def after(self, exc: BaseException, now_mono: float) -> float | None:
        """Seconds to wait before the next attempt after ``exc``; None when the caller should give up."""
        if not is_transient(exc) or now_mono + self._delay > self._deadline:
            return None
        wait = self._delay * self._rng.uniform(0.5, 1.0)
        self._delay = min(MAX_DELAY_S, self._delay * 2)
        return wait

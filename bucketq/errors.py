"""Exceptions raised by bucketq. All derive from ``BucketqError``."""

from __future__ import annotations


class BucketqError(Exception):
    """Base class of every bucketq error."""


class InvalidOption(BucketqError, ValueError):
    """An option given to a constructor is out of range or of the wrong type."""


class EncodeError(BucketqError, ValueError):
    """A payload could not be encoded by the queue's codec. Only its own push fails."""


class PayloadTooLarge(BucketqError, ValueError):
    """An encoded payload is larger than any bucket may hold (``bucket_max_bytes``)."""


class QueueClosed(BucketqError, RuntimeError):
    """The queue was drained or closed; it takes no more pushes or reserves."""


class BufferFull(BucketqError, RuntimeError):
    """``push_nowait`` found ``max_buffered_bytes`` reached; ``await push()`` waits instead."""


class WriteFailed(BucketqError):
    """A bucket could not be written after every retry; the pushes it held were not stored."""


class LeaseLost(BucketqError):
    """The consumer's lease on the bucket expired or was taken over; its state writes were refused."""


class AlreadyResolved(BucketqError, RuntimeError):
    """``ack``/``nack`` was called twice on the same message."""


class Retry(BucketqError):
    """Raised by a ``Worker`` handler: deliver the message again after ``delay`` seconds (None: the queue's
    backoff), with ``reason`` recorded. It still counts as a try. A ``delay`` that is not a number of seconds
    from 0 to a century (negative, NaN, infinite, a string) raises ``InvalidOption`` here, where it is built."""

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        from bucketq.options import check_delay  # options imports this module

        super().__init__(_check_reason(reason, "Retry") or "retry requested by the handler")
        try:
            self.delay = None if delay is None else check_delay(delay)
        except InvalidOption as exc:
            raise InvalidOption(f"Retry {exc}") from None


class Reject(BucketqError):
    """Raised by a ``Worker`` handler: the message cannot succeed; it goes straight to the dead letters with
    ``reason``, without further tries."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(_check_reason(reason, "Reject") or "rejected by the handler")


def _check_reason(reason: object, kind: str) -> str:
    """``reason`` if it is a str; else ``InvalidOption`` (``Retry(5)`` meant ``Retry(delay=5)``)."""
    if not isinstance(reason, str):
        hint = " (the delay is a keyword: Retry(reason, delay=S))" if kind == "Retry" else ""
        raise InvalidOption(f"{kind} takes a reason str{hint}, got {reason!r}")
    return reason


class HandlerTimeout(BucketqError, TimeoutError):
    """A ``Worker`` handler ran past ``handler_timeout``, or past ``drain_timeout`` once the worker was
    stopping, and was cancelled; its messages are retried with this as the reason."""


class MalformedBucket(BucketqError, ValueError):
    """A stored bucket does not match the documented format (docs/FORMAT.md)."""


class MessageHeld(BucketqError, RuntimeError):
    """``Queue.remove`` found the message in a bucket that a consumer holds under a live lease: it may be
    handling the message now. Nothing was removed; try again once that consumer resolved it or its lease ended."""

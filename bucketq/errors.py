"""Exceptions raised by bucketq. All derive from ``BucketqError``."""

from __future__ import annotations

from pymongo.errors import ServerSelectionTimeoutError


class BucketqError(Exception):
    """Base class of every bucketq error."""


class InvalidOption(BucketqError, ValueError):
    """An option given to a constructor is out of range or of the wrong type."""


class ServerUnreachable(BucketqError, ServerSelectionTimeoutError):
    """No MongoDB server answered: the message names the URI (redacted), what was tried for how long, and what
    each server said. Still a pymongo ``ServerSelectionTimeoutError``, as it was before bucketq wrapped it."""


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
    backoff), with ``reason`` recorded. It still counts as a try."""

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        super().__init__(reason or "retry requested by the handler")
        self.delay = delay


class Reject(BucketqError):
    """Raised by a ``Worker`` handler: the message cannot succeed; it goes straight to the dead letters with
    ``reason``, without further tries."""


class HandlerTimeout(BucketqError, TimeoutError):
    """A ``Worker`` handler ran past ``handler_timeout``; its messages are retried with this as the reason."""


class MalformedBucket(BucketqError, ValueError):
    """A stored bucket does not match the documented format (docs/FORMAT.md)."""


class MessageHeld(BucketqError, RuntimeError):
    """``Queue.remove`` found the message in a bucket that a consumer holds under a live lease: it may be
    handling the message now. Nothing was removed; try again once that consumer resolved it or its lease ended."""

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


class HandlerTimeout(BucketqError, TimeoutError):
    """A ``Worker`` handler ran past ``handler_timeout``, or past ``drain_timeout`` once the worker was
    stopping, and was cancelled; its messages are retried with this as the reason."""


class MalformedBucket(BucketqError, ValueError):
    """A stored bucket does not match the documented format (docs/FORMAT.md)."""


class MessageHeld(BucketqError, RuntimeError):
    """``Queue.remove`` found the message in a bucket that a consumer holds under a live lease: it may be
    handling the message now. Nothing was removed; try again once that consumer resolved it or its lease ended."""

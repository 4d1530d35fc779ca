"""``QueueInternals``: what bucketq's own modules built on a ``Queue`` use of its machinery. Here, beside the
machinery, so that a shell module that works on a queue's internals (``text_views``) takes them as they are and
imports nothing of the public face; ``bucketq.queue.internals(queue)`` is the door that hands them out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bucketq.shell.clock import ServerClock
from bucketq.store.aio.queue_store import AsyncQueueStore


@dataclass(frozen=True)
class QueueInternals:
    """What bucketq's own modules built on a ``Queue`` use of it (``Schedule``, ``Outbox``, ``Worker``, the CLI's and
    the dashboard's views): the one door to its machinery, ``bucketq.queue.internals(queue)``, instead of its private
    attributes (tests/test_queue_internals.py keeps it so). Not part of the public API."""

    store: AsyncQueueStore
    clock: ServerClock  # the server's clock as the queue reads it: stored times are the server's
    ready: Callable[[], Awaitable[None]]  # the queue's set-up (clock, indexes), due before a read or write
    wake: Callable[[], None]  # buckets were written: wake this queue's consumer, before any change stream tells

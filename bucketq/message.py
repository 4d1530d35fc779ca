"""A message handed to a consumer. ``ack``/``nack`` record its outcome; flushes make it durable."""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

from bucketq.core.held import ClaimedBucket


class Holding(Protocol):
    """What a message reads of the claimed bucket it came in (``bucketq.consumer.holding.Holding``)."""

    held: ClaimedBucket


class Consumer(Protocol):
    """What a message asks of the consumer that holds its bucket (``bucketq.consumer.consumer.Consumer``): protocols, so
    that this module does not import the consumer, which makes messages."""

    async def resolve(self, holding: Any, slot: int, outcome: tuple[str, float | None, str], *,
                      wait: bool) -> float | None: ...


class Message:
    """``payload``, ``id`` (stable across retries), ``tries`` (0 on first delivery), ``headers``,
    ``enqueued_at`` and ``key`` (the dedupe key given to ``push``, if any)."""

    __slots__ = ("payload", "id", "tries", "headers", "enqueued_at", "key", "_consumer", "_holding", "_slot")

    def __init__(self, payload: Any, id: str, tries: int, headers: dict[str, Any], enqueued_at: dt.datetime,
                 key: str | None, consumer: Consumer, holding: Holding, slot: int) -> None:
        self.payload = payload
        self.id = id
        self.tries = tries
        self.headers = headers
        self.enqueued_at = enqueued_at
        self.key = key
        self._consumer = consumer
        self._holding = holding
        self._slot = slot

    @property
    def resolved(self) -> bool:
        """Whether ``ack`` or ``nack`` was called (or a drain gave the message back)."""
        return self._holding.held.resolved(self._slot)

    async def ack(self, *, wait: bool = False) -> None:
        """Mark the message done. It is written at the next state flush (``state_flush_period``) or when its
        bucket is finished; ``wait=True`` waits for that write. Raises ``LeaseLost`` if this consumer no
        longer holds the bucket (another consumer will deliver the message again)."""
        await self._consumer.resolve(self._holding, self._slot, ("ack", None, ""), wait=wait)

    async def nack(self, delay: float | None = None, *, error: str | BaseException | None = None,
                   wait: bool = False) -> float | None:
        """Deliver the message again after ``delay`` seconds (default: the queue's backoff for its tries),
        without holding back its siblings; after ``max_attempts`` deliveries it goes to the dead letters
        with ``error`` as its reason. Returns the seconds until the retry, or None for a dead letter."""
        return await self._consumer.resolve(self._holding, self._slot, ("nack", delay, _reason(error)), wait=wait)

    async def dead_letter(self, *, error: str | BaseException | None = None, wait: bool = False) -> None:
        """Give up on the message: it goes straight to the dead letters with ``error`` as its reason, without
        the tries it has left."""
        await self._consumer.resolve(self._holding, self._slot, ("dead", None, _reason(error)), wait=wait)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, tries={self.tries}, payload={self.payload!r:.60})"


def _reason(error: str | BaseException | None) -> str:
    return "" if error is None else error if isinstance(error, str) else f"{type(error).__name__}: {error}"

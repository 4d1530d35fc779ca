"""A message handed to a consumer. ``ack``/``nack`` record its outcome; flushes make it durable."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, Protocol

from bucketq.core.held import ClaimedBucket


class Holding(Protocol):
    """What a message reads of the claimed bucket it came in (``bucketq.consumer.holding.Holding``)."""

    held: ClaimedBucket
    cancel_events: dict[int, asyncio.Event]


class Consumer(Protocol):
    """What a message asks of the consumer that holds its bucket (``bucketq.consumer.consumer.Consumer``): protocols, so
    that this module does not import the consumer, which makes messages."""

    async def resolve(self, holding: Any, slot: int, outcome: tuple[str, float | None, str], *,
                      wait: bool) -> float | None: ...

    def ack_at_once(self, holding: Any, slot: int) -> bool: ...


class Message:
    """``payload``, ``id`` (stable across retries), ``tries`` (0 on first delivery), ``headers``,
    ``enqueued_at`` and ``key`` (the dedupe key given to ``push``, if any).

    The fields besides ``payload`` are read from the claimed bucket when asked for, not when the message is
    made: most handlers read only the payload, and a consumer makes a message for each one it serves."""

    __slots__ = ("payload", "_consumer", "_holding", "_slot", "_headers")

    def __init__(self, payload: Any, consumer: Consumer, holding: Holding, slot: int) -> None:
        self.payload = payload
        self._consumer = consumer
        self._holding = holding
        self._slot = slot
        self._headers: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        """The message's id, ``"<bucket id>:<slot>"``: what ``push`` returned for it."""
        return self._holding.held.bucket.message_id(self._slot)

    @property
    def tries(self) -> int:
        """How many times it was delivered before: 0 on its first delivery."""
        return self._holding.held.tries(self._slot)

    @property
    def headers(self) -> dict[str, Any]:
        """The headers given at push time (an empty dict when none were)."""
        if self._headers is None:  # one dict for the message's lifetime, even when it had no headers
            self._headers = self._holding.held.bucket.headers[self._slot] or {}
        return self._headers

    @property
    def enqueued_at(self) -> dt.datetime:
        """When the message was pushed, on the producer's clock (UTC)."""
        return self._holding.held.bucket.enqueued_at(self._slot)

    @property
    def key(self) -> str | None:
        """The ``key`` given at push time, or None: the dedupe key, and a unique job's key."""
        return self._holding.held.bucket.keys[self._slot]

    @property
    def resolved(self) -> bool:
        """Whether ``ack`` or ``nack`` was called (or a drain gave the message back)."""
        return self._holding.held.resolved(self._slot)

    @property
    def cancelled(self) -> bool:
        """Whether ``Queue.cancel`` asked for this message while it is being handled (the consumer reads requests
        after a lease extension, at most every half lease). Once true, the message ends as cancelled however it is
        resolved: ``ack``, ``nack`` and ``dead_letter`` record the cancellation instead (a dead letter with
        ``cancelled: true``), and it is not retried."""
        return self._holding.held.cancel_requested(self._slot)

    async def wait_cancelled(self) -> None:
        """Return once the message's cancellation is requested (see ``cancelled``); never, if it is not."""
        if not self.cancelled:
            await self._holding.cancel_events.setdefault(self._slot, asyncio.Event()).wait()

    async def ack(self, *, wait: bool = False) -> None:
        """Mark the message done. It is written at the next state flush (``state_flush_period``) or when its
        bucket is finished (within ``finish_linger`` while the queue has a backlog); ``wait=True`` waits for that
        write, and has it made at once. Raises ``LeaseLost`` if this consumer no
        longer holds the bucket (another consumer will deliver the message again)."""
        # Most acks only record the state (no write waited for, no dedupe key to store first): no coroutine
        if wait or not self._consumer.ack_at_once(self._holding, self._slot):
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

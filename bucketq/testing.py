"""Test mode: queues on an in-memory database for your own unit tests, and a helper that runs a handler inline
over what was pushed. No MongoDB, no network, no threads.

    import bucketq.testing

    async def test_checkout_sends_a_receipt():
        async with bucketq.testing.queue("receipts") as q:
            await checkout(order, receipts=q)                 # your code pushes
            report = await bucketq.testing.run(q, send_receipt)  # your handler runs on each message
        assert report.acked == [{"order": 1, "email": "a@example.com"}]
        assert not report.dead

The queue is a real ``bucketq.Queue`` on ``bucketq.memory.MemoryDatabase``: pushes, delays, acks, nacks,
retries, dead letters, dedupe and ``stats()`` behave as on MongoDB. ``q.database`` is that database:
``q.database.operations`` lists every operation, ``q.database.faults`` injects lost replies, refusals and
delays, ``q.database.sync`` reads the stored documents.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.held import SlotState
from bucketq.errors import InvalidOption
from bucketq.memory import MemoryClient, MemoryDatabase
from bucketq.message import Message
from bucketq.queue import Queue

# Quick by default: a push is written within 5 ms, acks and nacks within 20 ms, an idle consumer looks again
# every 10 ms, a nack is retried at once (no backoff) and a drain does not wait for handlers that never finish.
TEST_DEFAULTS: dict[str, Any] = {"bucket_max_wait": 0.005, "state_flush_period": 0.02, "poll_interval": 0.01,
                                 "retry_base": 0.0, "retry_jitter": 0.0, "drain_timeout": 0.0}

ACKED, NACKED, DEAD = "acked", "nacked", "dead"


def queue(name: str = "events", *, database: MemoryDatabase | None = None, **options: Any) -> Queue:
    """A ``Queue`` named ``name`` on an in-memory database: a fresh one of its own unless ``database`` is given
    (queues on one database share their messages, as on MongoDB). ``options`` are ``Queue`` options; unset
    ones take ``TEST_DEFAULTS``, then the usual defaults. Use it as ``async with`` or close it."""
    return Queue(database if database is not None else MemoryClient()["test"], name=name,
                 **{**TEST_DEFAULTS, **options})


@dataclass(frozen=True)
class Delivery:
    """One delivery of a message to the handler, and how it ended: ``"acked"``, ``"nacked"`` (to be delivered
    again) or ``"dead"`` (dead-lettered: that was its last attempt). ``error`` is what the handler raised."""

    id: str
    payload: Any
    tries: int
    outcome: str
    error: BaseException | None = None


@dataclass
class Report:
    """What ``run`` did: every delivery in order, and per message its last outcome."""

    deliveries: list[Delivery] = field(default_factory=list)

    @property
    def outcomes(self) -> dict[str, str]:
        """Message id -> the outcome of its last delivery."""
        return {d.id: d.outcome for d in self.deliveries}

    def _last(self, outcome: str) -> list[Any]:
        last = {d.id: d for d in self.deliveries}
        return [d.payload for d in last.values() if d.outcome == outcome]

    @property
    def acked(self) -> list[Any]:
        """Payloads of the messages acknowledged in the end, in the order they were first delivered."""
        return self._last(ACKED)

    @property
    def nacked(self) -> list[Any]:
        """Payloads of the messages left to be retried later (their retry was not due yet)."""
        return self._last(NACKED)

    @property
    def dead(self) -> list[Any]:
        """Payloads of the messages dead-lettered."""
        return self._last(DEAD)

    @property
    def errors(self) -> list[BaseException]:
        """What the handler raised, delivery by delivery."""
        return [d.error for d in self.deliveries if d.error is not None]


async def run(q: Queue, handler: Callable[[Message], Any], *, idle_timeout: float = 0.1,
              limit: int = 10_000) -> Report:
    """Deliver every message that is due to ``handler`` (async or not), one at a time, as a ``Worker`` would: a
    return acks the message, an exception nacks it (retried per the queue's backoff, dead-lettered after
    ``max_attempts``), and a handler may ack or nack the message itself. Retries that come due within
    ``idle_timeout`` seconds are delivered too (with ``testing.queue``'s defaults, at once), so by default a
    message ends acked or dead. Messages scheduled later are left in the queue. Stops after ``limit``
    deliveries. Each outcome is stored before the next message is delivered."""
    if not callable(handler):
        raise InvalidOption("handler must be callable")
    report = Report()
    while len(report.deliveries) < limit and (message := await q.reserve(timeout=idle_timeout)) is not None:
        error = None
        try:
            result = handler(message)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            error = exc
        if not message.resolved:
            await (message.ack(wait=True) if error is None else message.nack(error=error, wait=True))
        report.deliveries.append(Delivery(message.id, message.payload, message.tries, _outcome(message), error))
    return report


def _outcome(message: Message) -> str:
    # The state the consumer recorded for the message's slot (an ack, a retry, or a dead letter).
    state = message._holding.held.state[message._slot]
    return {SlotState.ACKED: ACKED, SlotState.RETRY: NACKED, SlotState.DEAD: DEAD}.get(state, state.value)

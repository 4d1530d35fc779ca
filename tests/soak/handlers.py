"""The soak handlers' behaviour, chosen per message by the producer (``payload["fate"]``), and what they write
into the history. The same fates run in async handlers and in sync ones (on the ``Worker``'s threads):

    ok         returns at once (a few ms): acked
    fail_once  raises on its first try, then returns: nacked, then acked
    retry      raises ``Retry(delay=...)`` on its first try, then returns
    timeout    outlasts ``HANDLER_TIMEOUT_S`` on its first try (cut off: nacked), then returns
    (the slow phase adds ``SLOW_PHASE_S`` to every fate)
    reject     raises ``Reject``: dead-lettered at once
    poison     always raises: dead-lettered after ``max_attempts``
    long       runs until its cancellation (the producer cancels it) or ``LONG_S``: ends dead, "cancelled"
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import bucketq
from tests.soak import role
from tests.soak.history import History

FATES = {"ok": 80, "fail_once": 5, "retry": 4, "timeout": 2, "reject": 3, "poison": 1, "long": 2}
HANDLER_TIMEOUT_S = 5.0
LONG_S = 4.0  # within the handler timeout: a long run that hears of no cancel is acked
SLOW_PHASE_S = 2.0  # added per message during the slow phase; within the handler timeout too


def pick_fate(rng: random.Random) -> str:
    """A fate drawn by ``FATES``' weights."""
    return rng.choices(list(FATES), list(FATES.values()))[0]


class Recorder:
    """Writes a handler's ops: ``start``, ``end``, and the outcome (``ack`` on return; ``nack`` or ``dead`` from the
    worker's ``on_error`` hook, which hears of every failure, time-outs included)."""

    def __init__(self, history: History, queue: str) -> None:
        self.history = history
        self.queue = queue

    def _ids(self, message: bucketq.Message) -> dict[str, Any]:
        payload = message.payload if isinstance(message.payload, dict) else {}
        extra = {k: payload[k] for k in ("group", "seq") if k in payload}
        return {"queue": self.queue, "id": message.id, **extra}

    def start(self, message: bucketq.Message) -> None:
        """The handler starts running ``message``."""
        self.history.op("start", attempt=message.tries, **self._ids(message))

    def end(self, message: bucketq.Message) -> None:
        """The handler stopped running ``message``; ``lease_lost`` when its bucket was no longer held."""
        extra = {"lease_lost": True} if lease_lost(message) else {}
        self.history.op("end", queue=self.queue, id=message.id, **extra)

    def returned(self, message: bucketq.Message) -> None:
        """The handler returned: ``ack``, or ``dead`` when the message was cancelled meanwhile."""
        if message.cancelled:  # the worker records it as cancelled, whatever the handler did
            self.history.op("dead", queue=self.queue, id=message.id, reason="cancelled")
        else:
            self.history.op("ack", queue=self.queue, id=message.id)

    async def on_error(self, message: bucketq.Message, error: BaseException) -> None:
        """The ``Worker``'s ``on_error`` hook: ``nack``, or ``dead`` with why."""
        if message.cancelled:
            reason = "cancelled"
        elif isinstance(error, bucketq.Reject):
            reason = "rejected"
        elif message.tries + 1 >= role.MAX_ATTEMPTS and not isinstance(error, bucketq.LeaseLost):
            reason = "max_attempts"
        else:
            self.history.op("nack", queue=self.queue, id=message.id, reason=f"{type(error).__name__}: {error}"[:120])
            return
        self.history.op("dead", queue=self.queue, id=message.id, reason=reason)


def lease_lost(message: bucketq.Message) -> bool:
    """Whether this consumer no longer holds the message's bucket as its handler ends (a stall or a restart
    outlasted the lease): its group may then have gone on without it. The one look inside the library, as
    ``tests/stress/consumer.py``'s ``lease_left``: the history needs it to tell that from two holders at once."""
    held = message._holding.held
    return bool(held.lost or held.lease_until <= message._consumer._clock.latest())


def _fate(message: bucketq.Message) -> str:
    return message.payload.get("fate", "ok") if isinstance(message.payload, dict) else "ok"


def _failure(fate: str, tries: int) -> BaseException | None:
    """What the handler raises for this fate at this try, if anything (time-outs and long runs aside)."""
    if fate == "poison" or (fate == "fail_once" and tries == 0):
        return RuntimeError(f"{fate} on try {tries}")
    if fate == "retry" and tries == 0:
        return bucketq.Retry("asked to retry", delay=0.5)
    if fate == "reject":
        return bucketq.Reject("rejected by the soak handler")
    return None


def async_handler(recorder: Recorder, slow: Any) -> Any:
    """An async per-message handler; ``slow()`` says whether the slow phase is on."""

    async def handle(message: bucketq.Message) -> None:
        recorder.start(message)
        try:
            fate = _fate(message)
            await asyncio.sleep(random.uniform(0.001, 0.02) + (SLOW_PHASE_S if slow() else 0.0))
            if fate == "timeout" and message.tries == 0:
                await asyncio.sleep(HANDLER_TIMEOUT_S + 2.0)
            if fate == "long":
                try:
                    await asyncio.wait_for(message.wait_cancelled(), LONG_S)
                except TimeoutError:
                    pass
            if (error := _failure(fate, message.tries)) is not None:
                raise error
        finally:
            recorder.end(message)
        recorder.returned(message)

    return handle


def sync_handler(recorder: Recorder, slow: Any) -> Any:
    """The same as a plain ``def``, run on the worker's threads."""

    def handle(message: bucketq.Message) -> None:
        recorder.start(message)
        try:
            fate = _fate(message)
            time.sleep(random.uniform(0.001, 0.02) + (SLOW_PHASE_S if slow() else 0.0))
            if fate == "timeout" and message.tries == 0:
                time.sleep(HANDLER_TIMEOUT_S + 2.0)
            if fate == "long":
                until = time.monotonic() + LONG_S
                while not message.cancelled and time.monotonic() < until:
                    time.sleep(0.05)
            if (error := _failure(fate, message.tries)) is not None:
                raise error
        finally:
            recorder.end(message)
        recorder.returned(message)

    return handle

"""``Holding``: a claimed bucket as the consumer holds it (shared by the consumer's parts)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.held import ClaimedBucket


@dataclass
class Holding:
    """A claimed bucket's state machine with its payloads and the tasks and futures around it. ``payloads`` are
    decoded, or with ``load`` (a bucket its writer checked, ``StoredBucket.checked``) as stored, decoded by ``load``
    as each is served."""

    held: ClaimedBucket
    payloads: Sequence[Any]
    load: Callable[[Any], Any] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    flushing: asyncio.Task[None] | None = None  # the periodic flush under way, if any
    # slot -> set once its cancellation is requested, made when a handler waits for it (``Message.wait_cancelled``)
    cancel_events: dict[int, asyncio.Event] = field(default_factory=dict)

    def cancels_heard(self, slots: list[int]) -> None:
        """Wake the handlers waiting for the cancellation of ``slots`` (``ClaimedBucket.learn_cancels``)."""
        for slot in slots:
            if (event := self.cancel_events.get(slot)) is not None:
                event.set()

"""``Housekeeping``: a queue's retention deletes and tombstone reaping, run by one of its consumers at a time
(the holder of the lease ``bucketq.core.housekeeping`` describes), not by each: the others spend one command a
``HOUSEKEEPER_LEASE_S`` or so on trying to take it."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pymongo.errors import PyMongoError

from bucketq.core import claims, housekeeping
from bucketq.shell.clock import ServerClock
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")


class Housekeeping:
    """The housekeeping turn of one consumer (a queue object): ``round`` runs ``work`` while it holds the lease."""

    def __init__(self, store: AsyncQueueStore, clock: ServerClock, work: Callable[[], Awaitable[Any]]) -> None:
        self._store = store
        self._clock = clock
        self._work = work
        self._token = claims.new_token()  # per queue object: two in one process are two consumers
        self.holding = False  # this consumer took or renewed the lease at its last try
        self._next_try = 0.0  # monotonic time before which a consumer without the lease does not try again

    async def round(self) -> None:
        """One round (``setup.every``, each ``HOUSEKEEPING_EVERY_S``): the holder renews its lease and runs
        ``work``; another consumer tries to take the lease if its time to try has come, and runs ``work`` if it
        took it. Module constants are read here, at each round, so that a test can shorten them."""
        if not self.holding and time.monotonic() < self._next_try:
            return
        lease_s = housekeeping.HOUSEKEEPER_LEASE_S
        self.holding = await self._store.take_housekeeping(self._clock.now(), self._token, claims.owner_name(),
                                                           lease_s)
        if not self.holding:  # jittered: the consumers of a fleet started together do not try together
            self._next_try = time.monotonic() + random.uniform(0.5, 1.0) * lease_s
            return
        await self._work()

    async def give_up(self) -> None:
        """End the lease if held (a consumer closing), so that another consumer takes it at its next try."""
        if not self.holding:
            return
        self.holding = False
        with contextlib.suppress(PyMongoError):  # its lease ends by itself
            await self._store.give_up_housekeeping(self._clock.now(), self._token)

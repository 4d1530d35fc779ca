"""``Schedule``: a cron schedule that pushes one message per tick into a queue, exactly once per tick however
many schedulers run it (docs/guide/schedules.md). The ticks come from ``core.schedule``; this shell reads and
moves the schedule's state document and inserts each tick's bucket, whose ``_id`` is the tick's."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pymongo.errors import PyMongoError

from bucketq.core import schedule as ticks
from bucketq.core.format import bucket_document, encode_slot
from bucketq.queue import Queue, internals

log = logging.getLogger("bucketq.schedule")
MAX_SLEEP_S = 60.0  # a scheduler re-reads the state at least this often (another one may have moved it)


class Schedule:
    """Push ``payload`` into ``queue`` at every tick of the cron expression ``cron``, read in time zone ``tz``
    (a zoneinfo name). Schedulers of the same ``name`` (default: made of the expression, the zone and the
    payload) share one state document in ``<queue>.control``: run as many as you like, each tick is enqueued
    once. ``missed``: after a time with no scheduler running, ``"skip"`` (default) enqueues the latest missed
    tick only, ``"catch_up"`` every missed tick, the latest ``catch_up_limit`` of them at most. A schedule
    starts at its first run: ticks before it are not enqueued. ``clock`` (default: the queue's server clock)
    returns an aware datetime; tests pass their own."""

    def __init__(self, queue: Queue, cron: str, payload: Any, *, name: str | None = None, tz: str = "UTC",
                 missed: ticks.Missed = "skip", catch_up_limit: int = 100,
                 headers: Mapping[str, Any] | None = None,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self._slot, _ = encode_slot(queue.codec, payload, headers, None)
        if name is None:
            identity = (self._slot.payload, dict(headers or {}))
            digest = hashlib.blake2b(repr(identity).encode(), digest_size=4).hexdigest()
            name = f"{cron} {tz} {digest}"
        self.zone = ticks.check_schedule(cron, tz, missed, catch_up_limit, name)
        self.queue, self.cron, self.name, self.missed = queue, cron, name, missed
        self.catch_up_limit = catch_up_limit
        self._queue = internals(queue)
        self._clock = clock or self._queue.clock.now

    async def run_once(self, now: dt.datetime | None = None) -> list[dt.datetime]:
        """Enqueue the ticks due at ``now`` (default: the clock's) that no scheduler has; return them (UTC)."""
        await self._queue.ready()
        now = ticks.aware(now if now is not None else self._clock())
        store = self._queue.store
        state = await store.read_schedule(self.name)
        if state is None:  # the first run: ticks from now on
            await store.claim_tick(self.name, None, now, sent=True)
            return []
        last = state["tick"]
        if not state["sent"]:  # a scheduler stopped between its claim and its insert, or is in between now
            await self._enqueue(last, now)
        enqueued = []
        for tick in ticks.due_ticks(self.cron, self.zone, last=last, now=now, missed=self.missed,
                                    catch_up_limit=self.catch_up_limit):
            if not await store.claim_tick(self.name, last, tick):
                break  # another scheduler moved on first: the ticks from here are its to enqueue
            await self._enqueue(tick, now)
            enqueued.append(last := tick)
        if enqueued:
            self._queue.wake()
        return enqueued

    async def run(self) -> None:
        """Run until cancelled: enqueue what is due, then sleep until the next tick (or ``MAX_SLEEP_S``). A
        failure that outlasted the queue's retries (``write_timeout``) is logged and tried again a
        ``poll_interval`` later: a scheduler outlives a server's outage, and the tick stays due meanwhile."""
        while True:
            try:
                await self.run_once()
            except PyMongoError as exc:
                retry_s = self.queue.options.poll_interval
                log.warning("schedule %r: %s; trying again in %s s", self.name, exc, retry_s)
                await asyncio.sleep(retry_s)
                continue
            now = ticks.aware(self._clock())
            wait = (ticks.next_tick(self.cron, self.zone, now) - now).total_seconds()
            await asyncio.sleep(min(max(wait, 0.0), MAX_SLEEP_S))

    async def _enqueue(self, tick: dt.datetime, now: dt.datetime) -> None:
        """Insert the tick's bucket (a duplicate key: already stored), then mark the state sent."""
        slot = self._slot._replace(key=ticks.tick_key(self.name, tick))
        partitions = await self._queue.store.partition_count()  # the queue's: options.partitions may be None
        bucket = bucket_document(ticks.tick_bucket_id(self.queue.name, self.name, tick), [slot],
                                 codec=self.queue.codec.name, created=now, due=tick,
                                 partition=ticks.tick_partition(self.name, partitions))
        await self._queue.store.insert_buckets([bucket])
        await self._queue.store.mark_tick_sent(self.name, tick)

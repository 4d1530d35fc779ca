"""The consumer's flushes: a periodic loop that writes each held bucket's resolutions and extends its lease, one
flush task per bucket, and the end of an ordered group's turn after a bucket's last write."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from pymongo.errors import PyMongoError

from bucketq.consumer.claiming import Backlog
from bucketq.consumer.finishing import Finishes
from bucketq.consumer.holding import Holding
from bucketq.core import group_turn
from bucketq.core.group_turn import GroupStep
from bucketq.core.held import FlushPlan
from bucketq.core.retry import is_too_large
from bucketq.errors import LeaseLost, WriteFailed
from bucketq.metrics import Metrics
from bucketq.options import QueueOptions
from bucketq.shell.clock import ServerClock
from bucketq.shell.unique import release_keys
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")


class Flushing:
    """Flushes the buckets in ``holdings`` (the consumer's list, shared with the other parts) that consumer
    ``owner`` holds: writes to ``store``, each flush a task of ``spawn``'s; lone finishes gathered in ``finishes``
    while the queue has a ``backlog`` and the consumer is not ``draining``; an ordered group's turn ended through
    ``converse`` (``OrderedGroupTurns``)."""

    def __init__(self, store: AsyncQueueStore, clock: ServerClock, options: QueueOptions, wakeup: Wakeup,
                 holdings: list[Holding], *, owner: str, metrics: Metrics, finishes: Finishes, backlog: Backlog,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]],
                 converse: Callable[[Generator[GroupStep, Any, None]], Coroutine[Any, Any, None]],
                 draining: Callable[[], bool]) -> None:
        self._store = store
        self._clock = clock
        self._options = options
        self._wakeup = wakeup
        self._holdings = holdings
        self._owner = owner
        self._metrics = metrics
        self._finishes = finishes
        self._backlog = backlog
        self._spawn = spawn
        self._converse = converse
        self._draining = draining
        self._loop: asyncio.Task[None] | None = None  # the periodic flush loop, once started

    def start(self) -> None:
        """Start the periodic flush loop, unless it runs already."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._flush_loop(), name="bucketq-flush")

    def stop(self) -> asyncio.Task[None] | None:
        """Cancel the flush loop, if it runs; returns its task, for the caller to wait for."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
        return loop

    async def _flush_loop(self) -> None:
        """Every ``state_flush_period``, start a flush for each held bucket that needs one and has none under
        way. Each bucket's flush is a task of its own: one write retrying for a long time (a server
        restarting) holds back only its own bucket, never the lease extensions of the others."""
        while True:
            await asyncio.sleep(self._options.state_flush_period)
            now = self._clock.latest()
            for holding in list(self._holdings):
                if holding.held.needs_flush(now):
                    self.schedule_flush(holding)

    def schedule_flush(self, holding: Holding) -> None:
        """Start a flush of ``holding`` unless one is under way: that one goes on to write what is resolved
        meanwhile when the bucket is finished or someone waits for a resolution (see ``flush``)."""
        if holding.flushing is None or holding.flushing.done():
            holding.flushing = self._spawn(self._flush_logged(holding))

    async def _flush_logged(self, holding: Holding) -> None:
        try:
            await self.flush(holding)
        except Exception as exc:
            log.warning("state flush of bucket %s failed; will retry: %s", holding.held.bucket.id, exc)

    async def flush(self, holding: Holding, *, release: bool = False) -> None:
        """Write the bucket's pending plan (a failed one first, as it was), then go on while resolutions that
        someone waits for were made meanwhile. A release, or a bucket with every slot resolved, goes on until
        the write that ends the bucket is applied or refused."""
        held = holding.held
        async with holding.lock:
            while not held.ended and holding in self._holdings:
                plan = held.take_plan(self._clock.now(), release=release, host=self._owner, pid=os.getpid())
                await self._run(holding, plan)
                if not held.ended and held.cancels_due(self._clock.now()):
                    await self._read_cancels(holding)
                if not (release or held.finished or (held.dirty and holding.waiters)):
                    return

    async def _run(self, holding: Holding, plan: FlushPlan) -> None:
        held = holding.held
        refused: WriteFailed | None = None
        try:
            # raises: the plan stays pending, to be retried as it is. A lone finish that nobody waits for, while the
            # queue has a backlog (more buckets, so more finishes, follow soon), goes with the others that come
            # within a linger (``Finishes``). Else, and in a drain, it is written at once: a consumer that dies
            # meanwhile gives back its bucket's acks since the last flush, which gathering only pays for when busy.
            if (plan.lone_finish and not holding.waiters and not self._draining() and self._options.finish_linger
                    and self._backlog.likely(self._holdings[-1].held)):
                applied = await self._finishes.finish(plan)
            else:
                applied = await self._store.write_plan(plan)
        except Exception as exc:
            if not is_too_large(exc):
                raise
            # Over 16 MiB (a bucket someone else wrote near the limit): the same plan would be refused for ever.
            # The bucket is given up as a lost lease would be: it comes back when the lease expires.
            refused = WriteFailed(f"a write for bucket {held.bucket.id} was refused as too large ({exc}); its "
                                  "unflushed messages come back when the lease expires")
            applied = False
        held.outcome(plan, applied)
        if applied and held.bucket.unique:  # before the acks return: a push of the key after one is not merged
            await release_keys(self._store, held.bucket, plan.slots)
        self._metrics.flushed(plan, applied)
        if refused is not None:
            log.error("%s", refused)
        elif not applied:
            log.warning("lease on bucket %s lost; its unflushed state was refused", held.bucket.id)
        elif plan.retry_docs:
            self._wakeup.due(min(d["due"] for d in plan.retry_docs), self._clock)
        if held.ended and held.bucket.group is not None:  # before the acks return: then the group has moved on
            await self._end_turn(held.bucket.group, held.bucket.partition, held.token)
        for slot in plan.slots if holding.waiters else ():
            future = holding.waiters.pop(slot, None)
            if future is not None and not future.done():
                if applied:
                    future.set_result(None)
                else:
                    future.set_exception(refused or LeaseLost(f"the lease on bucket {held.bucket.id} was lost "
                                                              "before the flush"))
        if held.ended:
            self._holdings.remove(holding)
            for future in holding.waiters.values():
                if not future.done():
                    future.set_exception(LeaseLost(f"bucket {held.bucket.id} is no longer held"))

    async def _read_cancels(self, holding: Holding) -> None:
        """Read the cancel requests made on a held bucket since its claim (``core.cancel``): at most every
        half lease, after a lease extension, so a running handler hears of one within about ``lease / 2``.
        A read, not the extension's own reply: the flush writes stay plain updates."""
        requested = await self._store.cancel_requests(holding.held.bucket.ref)
        if isinstance(requested, list):
            holding.cancels_heard(holding.held.learn_cancels([s for s in requested if isinstance(s, int)]))

    async def _end_turn(self, group: str, partition: int | None, token: str) -> None:
        """``group_turn.end_turn``. On failure the lock expires with the lease, and waiting buckets come back at
        their recheck time."""
        self._wakeup.notify()  # our claims skipped the ordered group's later buckets while we held it: no event says so
        try:
            await self._converse(group_turn.end_turn(group, partition, token, self._clock.now()))
        except PyMongoError as exc:
            log.warning("ordered group %r: unlock or hand-off failed; the lock expires with the lease: %s", group, exc)

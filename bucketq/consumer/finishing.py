"""Finishes gathered: the finish writes of buckets whose last messages were resolved within a short linger go to
the server as one bulk write (``AsyncQueueStore.finish_many``), not one command a bucket, as the producer's group
commit gathers inserts. A consumer working through a backlog finishes a bucket every few milliseconds, and each
finish alone cost a command's client CPU (about 0.3 ms through the async driver, 0.3 µs a message of a bucket of
1,024)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from bucketq.core.held import FlushPlan
from bucketq.errors import WriteFailed
from bucketq.store.aio.queue_store import AsyncQueueStore

MOST = 16  # finishes written at once when this many wait


class Finishes:
    def __init__(self, store: AsyncQueueStore, linger_s: float,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]]) -> None:
        self._store = store
        # at most state_flush_period, a third of the lease at most: far below any lease. At 100,000 messages a
        # second, buckets of 1,024 end every 10 ms: the default 50 ms gathers about five.
        self._linger_s = linger_s
        self._spawn = spawn  # the consumer's: a drain waits for the writes under way, then cancels them
        self._waiting: list[tuple[FlushPlan, asyncio.Future[bool]]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def finish(self, plan: FlushPlan) -> bool:
        """Whether ``plan``'s finish (``FlushPlan.lone_finish``) was applied, once written with the others that
        came within the linger. Raises, as a flush's write does, when the write failed: the plan stays pending."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._waiting.append((plan, future))
        if len(self._waiting) >= MOST:
            self.write_now()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger_s, self.write_now)
        return await future

    def write_now(self) -> None:
        """Write the finishes waiting, without waiting for more (the linger is over, or a drain began)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            self._spawn(self._write(waiting))

    async def _write(self, waiting: list[tuple[FlushPlan, asyncio.Future[bool]]]) -> None:
        finishes = {plan.ref["_id"]: (plan.filter, plan.final, plan.mine) for plan, _ in waiting}
        try:
            applied = set(await self._store.finish_many(finishes))  # type: ignore[arg-type]  # lone finishes have mine
        except Exception as exc:
            for plan, future in waiting:
                if not future.done():  # each its own error: one shared by several tasks would gather their tracebacks
                    failure = WriteFailed(f"the finish of bucket {plan.ref['_id']} failed: {exc}")
                    failure.__cause__ = exc
                    future.set_exception(failure)
            return
        for plan, future in waiting:
            if not future.done():
                future.set_result(plan.ref["_id"] in applied)

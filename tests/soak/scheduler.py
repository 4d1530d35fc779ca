"""A soak scheduler: ``python -m tests.soak.scheduler URI DB RUN_DIR PROC``: a ``bucketq.Schedule`` firing every
minute into ``ticks``, run by ``run_once`` each second (what ``Schedule.run`` does, with the ticks it enqueued
in hand: each one goes into the history as ``tick``). Several schedulers may run: each tick is enqueued once.

Beside it, an operator's chore: dead letters older than ``DEAD_KEPT_S`` are purged (``purge_dead``), so that
an hour's run does not grow its dead-letter collections by design; each is first written into the history as
``dead`` with ``observed: "dead_letters"`` (the end of a message whose deciding process was killed before it
could say so, such as a cancel acknowledged to no one)."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys

from pymongo.errors import PyMongoError

import bucketq
from tests.soak import role

NAME = "minutely"
CRON = "* * * * *"
EVERY_MS = 60_000.0
DEAD_KEPT_S = 60.0
PURGE_EVERY_S = 20.0


async def schedule(ctx: role.Context) -> None:
    """Fire the schedule's ticks until stopped, and purge old dead letters beside it."""
    q = ctx.queue(role.TICKS)
    schedule = bucketq.Schedule(q, CRON, {"tick": NAME}, name=NAME)
    now_ms = ctx.history.stamp()["at"]
    first_at = (now_ms // EVERY_MS + 1) * EVERY_MS  # a schedule's first run enqueues no tick from before it
    ctx.history.op("schedule_config", schedule=NAME, every_ms=EVERY_MS, first_at=first_at)
    chores = asyncio.create_task(_purge_dead_letters(ctx))
    try:
        while not await ctx.pause(1.0):
            try:
                ticks = await schedule.run_once()
            except (bucketq.BucketqError, PyMongoError) as exc:  # a restart, a stall: the tick stays due
                print(f"{ctx.history.proc}: run_once failed: {exc}", file=sys.stderr)
                continue
            for tick in ticks:
                ctx.history.op("tick", schedule=NAME, tick_at=tick.astimezone(dt.timezone.utc).timestamp() * 1000)
    finally:
        chores.cancel()
        await q.close()


async def _purge_dead_letters(ctx: role.Context) -> None:
    queues = [ctx.queue(name) for name in (role.QUEUE, role.RATED, role.BULK)]
    try:
        while not await ctx.pause(PURGE_EVERY_S):
            for q in queues:
                try:
                    letters = await q.dead_letters(limit=1000, older_than=DEAD_KEPT_S)
                    for letter in letters:
                        reason = "cancelled" if letter.get("cancelled") else str(letter.get("error"))[:120]
                        ctx.history.op("dead", queue=q.name, id=str(letter["_id"]), reason=reason,
                                       observed="dead_letters")
                    if letters:
                        await q.purge_dead(ids=[str(letter["_id"]) for letter in letters])
                except (bucketq.BucketqError, PyMongoError) as exc:
                    print(f"{ctx.history.proc}: dead-letter purge failed: {exc}", file=sys.stderr)
    finally:
        for q in queues:
            await q.close()


def main() -> int:
    """The role's entry point."""
    return role.run(schedule, role.parser(__doc__ or "").parse_args())


if __name__ == "__main__":
    sys.exit(main())

"""A soak producer: ``python -m tests.soak.producer URI DB RUN_DIR PROC [--rate N]``.

It pushes, about ``--rate`` times a second, a mix of kinds into ``jobs``: plain, delayed, prioritised, unique
(``unique_for``), grouped (``group=``, with a sequence per group); bursts of ``RATE_BURST`` into the rate-limited
``rated`` (``push_many``: a burst is the limit's whole window, so that bursts of both producers meeting in a
window test it); plain ones into ``bulk`` (the ``BatchQueue``'s). Each ``jobs`` payload names its handler's *fate*
(``handlers.FATES``). It cancels a share of its delayed messages while they wait, and the long-running ones once
a handler holds them. Producers
are held back (application backpressure) while the ``jobs`` backlog is above ``BACKLOG_HIGH``: the slow phase
makes it grow.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
from typing import Any

import bucketq
from tests.soak import role
from tests.soak.handlers import pick_fate

KINDS = {"plain": 30, "delayed": 12, "priority": 10, "unique": 8, "group": 15, "rate": 3, "bulk": 15}  # by weight
RATE_BURST = role.RATE_LIMIT["count"]
BACKLOG_HIGH = 150
WINDOW = 40  # pushes in flight at most
CANCEL_PENDING = 0.2  # of the delayed messages
LONG_CANCEL_AFTER_S = 1.5


async def produce(ctx: role.Context) -> None:
    """Push the mix until stopped; then wait for the pushes in flight."""
    rng = random.Random(f"{ctx.args.seed}:{ctx.history.proc}")
    jobs, rated, bulk = ctx.queue(), ctx.queue(role.RATED), ctx.queue(role.BULK)
    queues = {role.QUEUE: jobs, role.RATED: rated, role.BULK: bulk}
    slots = asyncio.Semaphore(WINDOW)
    group_seq: dict[str, int] = {}
    tasks: set[asyncio.Task[None]] = set()
    backlog = {"ready": 0}
    watcher = asyncio.create_task(_watch_backlog(ctx, jobs, backlog))
    n = itertools.count()

    async def push(queue: str, kind: str, payload: dict[str, Any], record: dict[str, Any], **options: Any) -> None:
        try:
            if kind == "rate":
                ids = await queues[queue].push_many([{**payload, "n": f"{payload['n']}.{k}"}
                                                     for k in range(RATE_BURST)])
            else:
                ids = [await queues[queue].push(payload, **options)]
        except bucketq.BucketqError as exc:
            print(f"{ctx.history.proc}: push failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return
        finally:
            slots.release()
        for message_id in ids:
            ctx.history.op("push_ok", queue=queue, id=message_id, kind=kind, **record)
        if payload["fate"] == "long":
            await ctx.pause(LONG_CANCEL_AFTER_S)
            await _cancel(ctx, jobs, ids[0])
        elif kind == "delayed" and rng.random() < CANCEL_PENDING:
            await _cancel(ctx, jobs, ids[0])

    try:
        while not ctx.stop.is_set():
            if backlog["ready"] > BACKLOG_HIGH:
                ctx.history.sample("held_by_backlog", backlog["ready"])
                if await ctx.pause(0.5):
                    break
                continue
            await slots.acquire()
            i = next(n)
            kind = rng.choices(list(KINDS), list(KINDS.values()))[0]
            payload = {"p": ctx.history.proc, "n": i, "fate": "ok" if kind in ("rate", "bulk") else pick_fate(rng)}
            queue, options, record = role.QUEUE, {}, {}
            if kind == "delayed":
                delay = round(rng.uniform(0.5, 8.0), 3)
                options["delay"] = delay
                record["due"] = ctx.history.stamp()["at"] + delay * 1000
            elif kind == "priority":
                options["priority"] = record["priority"] = rng.randint(1, 9)
            elif kind == "unique":
                key = f"{ctx.history.proc}:u{rng.randrange(10)}"
                options.update(key=key, unique_for=role.UNIQUE_FOR_S)
                record["unique_key"] = key
            elif kind == "group":
                group = f"{ctx.history.proc}:g{rng.randrange(4)}"
                seq = group_seq[group] = group_seq.get(group, -1) + 1
                options["group"] = record["group"] = payload["group"] = group
                record["seq"] = payload["seq"] = seq
            elif kind == "rate":
                queue = role.RATED
            elif kind == "bulk":
                queue, kind = role.BULK, "plain"
            task = asyncio.create_task(push(queue, kind, payload, record, **options))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if await ctx.pause(rng.expovariate(ctx.args.rate)):
                break
        await asyncio.gather(*tasks)
    finally:
        watcher.cancel()
        for q in queues.values():
            await q.close()


async def _cancel(ctx: role.Context, q: bucketq.Queue, message_id: str) -> None:
    try:
        outcome = await q.cancel(message_id)
    except bucketq.BucketqError as exc:
        print(f"{ctx.history.proc}: cancel failed: {exc}", file=sys.stderr)
        return
    if outcome != "not_found":
        ctx.history.op("cancel_ok", queue=q.name, id=message_id, outcome=outcome)


async def _watch_backlog(ctx: role.Context, q: bucketq.Queue, backlog: dict[str, int]) -> None:
    while True:
        try:
            stats = await q.stats()
            backlog["ready"] = stats["ready"]
        except Exception as exc:  # a restart or a stall: keep the last reading
            print(f"{ctx.history.proc}: stats failed: {exc}", file=sys.stderr)
        await asyncio.sleep(2.0)


def main() -> int:
    """The role's entry point."""
    p = role.parser(__doc__ or "")
    p.add_argument("--rate", type=float, default=8.0, help="pushes per second")
    return role.run(produce, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())

"""A soak consumer: ``python -m tests.soak.consumer URI DB RUN_DIR PROC``: a ``reserve_many`` / ``ack`` loop on the
rate-limited queue ``rated`` (``role.RATE_LIMIT``, the same in every consumer), each ack waited for
(``ack(wait=True)``) so that the history says which acks the server has (``flushed``)."""

from __future__ import annotations

import asyncio
import sys

import bucketq
from tests.soak import role
from tests.soak.handlers import SLOW_PHASE_S

BATCH = 10


async def consume(ctx: role.Context) -> None:
    """Reserve, ack and wait for the acks of ``rated`` until stopped."""
    limit = bucketq.RateLimit(role.RATE_LIMIT["count"], per=role.RATE_LIMIT["per_s"])
    q = ctx.queue(role.RATED, rate_limit=limit)
    h = ctx.history
    try:
        while not ctx.stop.is_set():
            try:
                messages = await q.reserve_many(BATCH, timeout=0.5)
            except bucketq.BucketqError as exc:
                print(f"{h.proc}: reserve failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                await ctx.pause(0.2)
                continue
            for m in messages:
                h.op("start", queue=q.name, id=m.id, attempt=m.tries)
            if ctx.slow:
                await asyncio.sleep(SLOW_PHASE_S)
            for m in messages:
                h.op("ack", queue=q.name, id=m.id)
                h.op("end", queue=q.name, id=m.id)
            results = await asyncio.gather(*(m.ack(wait=True) for m in messages), return_exceptions=True)
            flushed = [m.id for m, r in zip(messages, results, strict=True) if r is None]
            if flushed:
                h.op("flushed", queue=q.name, ids=flushed)
    finally:
        await q.close()


def main() -> int:
    """The role's entry point."""
    return role.run(consume, role.parser(__doc__ or "").parse_args())


if __name__ == "__main__":
    sys.exit(main())

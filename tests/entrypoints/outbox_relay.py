"""A relay process for the outbox crash tests: ``python -m tests.entrypoints.outbox_relay URI DB SOURCE QUEUE
[--die-before-pull] [--batch-size N]``.

Relays until no event is waiting, then exits 0. With ``--die-before-pull`` it kills itself with SIGKILL at the
start of its first pull: after the pass's buckets are stored in the queue, before any event is taken out of its
document. That is the one moment at which a crash could make a restarted relay enqueue events twice.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal

from pymongo import AsyncMongoClient

import bucketq
from bucketq.core.outbox_plan import RelayPass
from bucketq.outbox import Outbox


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("db")
    parser.add_argument("source")
    parser.add_argument("queue")
    parser.add_argument("--die-before-pull", action="store_true")
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args()
    client: AsyncMongoClient = AsyncMongoClient(args.uri, tz_aware=True)
    queue = bucketq.Queue(client, name=args.queue, db=args.db)
    relay = Outbox(args.source, queue, batch_size=args.batch_size)
    if args.die_before_pull:
        async def die(batch: RelayPass, now: dt.datetime) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        relay._remove = die  # type: ignore[method-assign]
    while await relay.run_once():
        pass
    await queue.close()
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())

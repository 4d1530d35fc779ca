"""A consumer process for the crash tests: ``python -m tests.entrypoints.consumer_proc URI DB QUEUE [--dedupe]
[--die-after N] [--rate-limit LIMIT/PER] [--housekeeping-every S]``.

Each handled message is recorded in the collection ``processed`` ({msg, i, g, pid, served, start, end, tries,
cancelled}) before it is acked (``served``: the queue's reading of the server's clock when it was handed over;
``cancelled``: set after the ack when the consumer had heard of a cancel request by then, so that the ack recorded a
cancellation, see ``Queue.cancel``). With ``--die-after N`` the process kills itself with SIGKILL right after acking
its Nth message, while it still holds its bucket with acks not yet flushed: the worst moment for a crash. With
``--housekeeping-every S`` its housekeeping rounds come every S seconds, under a lease of 5 S
(``bucketq.core.housekeeping``), for the tests of the housekeeping lease's hand-over.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time

from pymongo import AsyncMongoClient

import bucketq
from bucketq.core import housekeeping


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("db")
    parser.add_argument("queue")
    parser.add_argument("--dedupe", action="store_true")
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--rate-limit", help="LIMIT/PER: the queue's rate limit (bucketq.RateLimit)")
    parser.add_argument("--idle-timeout", type=float, default=3.0, help="seconds idle before it ends")
    parser.add_argument("--housekeeping-every", type=float, help="seconds between housekeeping rounds")
    args = parser.parse_args()
    if args.housekeeping_every:
        housekeeping.HOUSEKEEPING_EVERY_S = args.housekeeping_every
        housekeeping.HOUSEKEEPER_LEASE_S = 5 * args.housekeeping_every
    client: AsyncMongoClient = AsyncMongoClient(args.uri, tz_aware=True)
    rate_limit = None
    if args.rate_limit:
        limit, per = args.rate_limit.split("/")
        rate_limit = bucketq.RateLimit(int(limit), per=float(per))
    q = bucketq.Queue(client, name=args.queue, db=args.db, lease=2.0, state_flush_period=0.5, dedupe=args.dedupe,
                      rate_limit=rate_limit)
    processed = client[args.db].processed
    handled = 0
    async for message in q.consume(idle_timeout=args.idle_timeout):
        start = time.time()
        await asyncio.sleep(0.001)  # the handler's work
        record = {"msg": message.id, "i": message.payload["i"], "g": message.payload.get("g"), "pid": os.getpid(),
                  "served": q._clock.now(),
                  "start": start, "end": time.time(), "tries": message.tries, "cancelled": False}
        await processed.insert_one(record)
        cancelled = message.cancelled  # read as the ack resolves it (no await in between): then it ends cancelled
        await message.ack()
        if cancelled:
            await processed.update_one({"_id": record["_id"]}, {"$set": {"cancelled": True}})
        handled += 1
        if handled == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
    await q.close()
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())

"""A soak batch consumer: ``python -m tests.soak.batch URI DB RUN_DIR PROC``: a ``bucketq.BatchQueue`` (the Spark
driver's synchronous shell) on ``bulk`` claims up to ``MAX_BUCKETS`` buckets, "processes" their messages and
commits them; ``flushed`` follows the commit (the server has the batch's finish). Its blocking calls run on a
thread, so the role's event loop (signals, samples) goes on."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

import bucketq
from bucketq.batch import Batch, BatchQueue
from bucketq.core.format import parse_bucket
from tests.soak import role
from tests.soak.faults import LEASE_S
from tests.soak.handlers import SLOW_PHASE_S

MAX_BUCKETS = 4
BATCH_LEASE_S = 10 * LEASE_S  # a batch job's lease is long (5 minutes by default); still shorter than the run


async def consume(ctx: role.Context) -> None:
    """Claim, "process" and commit batches of ``bulk`` until stopped."""
    client: MongoClient[Any] = MongoClient(ctx.args.uri, tz_aware=True, serverSelectionTimeoutMS=60_000)
    bq = BatchQueue(client, name=role.BULK, db=ctx.db_name, lease=BATCH_LEASE_S, max_attempts=role.MAX_ATTEMPTS,
                    op_timeout_s=role.WRITE_TIMEOUT_S, tombstone_retention=role.TOMBSTONES_KEPT_S)
    h = ctx.history
    try:
        while not ctx.stop.is_set():
            try:
                batch = await asyncio.to_thread(bq.claim, MAX_BUCKETS)
            except (PyMongoError, bucketq.BucketqError) as exc:
                print(f"{h.proc}: claim failed: {exc}", file=sys.stderr)
                await ctx.pause(0.5)
                continue
            if batch is None:
                await ctx.pause(0.5)
                continue
            ids = _start(h, batch)
            await asyncio.sleep(SLOW_PHASE_S if ctx.slow else 0.05)
            for message_id in ids:
                h.op("ack", queue=role.BULK, id=message_id)
                h.op("end", queue=role.BULK, id=message_id)
            try:
                finished = await asyncio.to_thread(bq.commit, batch)
            except (PyMongoError, bucketq.BucketqError) as exc:  # its buckets come back after the lease
                print(f"{h.proc}: commit failed: {exc}", file=sys.stderr)
                continue
            if finished == len(batch.buckets):  # else some lease passed to another claim: which is not said
                h.op("flushed", queue=role.BULK, ids=ids)
    finally:
        bq.close()
        client.close()


def _start(h: Any, batch: Batch) -> list[str]:
    """``start`` for each message of the batch not yet done (its try counted as ``Message.tries`` counts it); their
    ids."""
    ids = []
    for doc in batch.buckets:
        bucket = parse_bucket(doc)
        for slot in range(bucket.size):
            if slot not in bucket.done:
                message_id = bucket.message_id(slot)
                h.op("start", queue=role.BULK, id=message_id, attempt=bucket.base_tries[slot] + bucket.claims - 1)
                ids.append(message_id)
    return ids


def main() -> int:
    """The role's entry point."""
    return role.run(consume, role.parser(__doc__ or "").parse_args())


if __name__ == "__main__":
    sys.exit(main())

"""A writer process of the stress harness:
``python -m tests.stress.writer URI DB QUEUE --writer W --gen G --target N --log PATH [--die-after-acks K]
[--unkeyed] [--groups K]``.

With ``--groups K`` every fourth run of seqs is pushed into K ordered groups (``common.ordered_group``), in seq
order: the harness checks that each group is delivered in that order, one message at a time.

Pushes messages ``(W, G, 0..)`` with up to ``--window`` pushes pending, until ``--target`` of them were
acknowledged (``push`` returned); each with its dedupe key, or none with ``--unkeyed``. Its log is the harness's
record of what the queue owes:

    t A B    seqs A..B-1 are about to be pushed (written before any of them is handed to ``push``)
    ok S     ``push`` of seq S returned: the message is durable and must be processed
    fail S   ``push`` of seq S raised (an error of bucketq); it may or may not be stored
    done     every push resolved and the queue was closed

With ``--die-after-acks K`` the process SIGKILLs itself once K pushes were acknowledged, right after handing
the next chunk of pushes to the queue, at a random moment within about ``bucket_max_wait``: while their bucket
is still open in memory, or while its insert is on the wire. That is the "producer killed mid-bucket" fault:
those pushes never returned, so they may be lost; every acknowledged one must survive.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

from pymongo import AsyncMongoClient

import bucketq
from tests.stress.common import GROUPED_RUN, LineLog, die, message_key, ordered_group, payload, queue_options

CHUNK = GROUPED_RUN


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("db")
    parser.add_argument("queue")
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--gen", type=int, required=True)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--window", type=int, default=400)
    parser.add_argument("--bucket-max-size", type=int, default=100)
    parser.add_argument("--bucket-max-wait", type=float, default=0.05)
    parser.add_argument("--die-after-acks", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0, help="pushes per second at most (0: no limit)")
    parser.add_argument("--unkeyed", action="store_true", help="push without dedupe keys")
    parser.add_argument("--groups", type=int, default=0, help="ordered groups for the even seqs (0: none)")
    args = parser.parse_args()

    log = LineLog(args.log)
    client: AsyncMongoClient = AsyncMongoClient(args.uri, tz_aware=True, serverSelectionTimeoutMS=60_000)
    q = bucketq.Queue(client, name=args.queue, db=args.db,
                      **queue_options(dedupe=False, bucket_max_size=args.bucket_max_size,
                                      bucket_max_wait=args.bucket_max_wait))
    acked = 0
    failed = 0
    pending: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(args.window)

    async def push(seq: int) -> None:
        nonlocal acked, failed
        try:
            await q.push(payload(args.writer, args.gen, seq, args.payload_bytes),
                         key=None if args.unkeyed else message_key(args.writer, args.gen, seq),
                         group=ordered_group(args.writer, args.gen, seq, args.groups))
        except bucketq.BucketqError as exc:
            failed += 1
            log.write(f"fail {seq} {type(exc).__name__}")
            return
        finally:
            slots.release()
        log.write(f"ok {seq}")
        acked += 1

    async def syncer() -> None:
        while True:
            await asyncio.sleep(0.5)
            log.sync()

    sync_task = asyncio.create_task(syncer())
    loop = asyncio.get_running_loop()
    started = loop.time()
    seq = 0
    try:
        while acked < args.target:
            # Never more pushes pending than could still be needed: the target is met exactly unless pushes fail.
            room = args.target - acked - len(pending)
            if room <= 0:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if args.die_after_acks and acked >= args.die_after_acks and pending:
                    die()  # the last pushes are all in flight: die among them
                continue
            count = min(CHUNK, room)
            for _ in range(count):
                await slots.acquire()
            if args.rate:
                ahead = started + seq / args.rate - loop.time()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            # No await from here until every push of the chunk is a task: the line covers exactly them.
            log.write(f"t {seq} {seq + count}")
            for _ in range(count):
                task = asyncio.create_task(push(seq))
                pending.add(task)
                task.add_done_callback(pending.discard)
                seq += 1
            if args.die_after_acks and acked >= args.die_after_acks:
                await asyncio.sleep(0)  # the chunk's pushes enter the open bucket
                await asyncio.sleep(random.uniform(0, 1.5 * args.bucket_max_wait))
                die()
            if failed > args.target:
                print(f"writer {args.writer}.{args.gen}: {failed} pushes failed, giving up", file=sys.stderr)
                return 2
        await asyncio.gather(*pending)
        await q.close()
        log.write("done")
    finally:
        sync_task.cancel()
        log.close()
        await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

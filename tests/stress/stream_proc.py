"""The processes of the stream stress run (``tests/stress/streams.py``):

``python -m tests.stress.stream_proc writer URI DB STREAM --writer W --gen G --count N --log PATH [--rate R]``
    pushes ``{"w": W, "g": G, "s": 0..N-1}`` in chunks of 10; logs ``ok W.G.S POS`` once ``push_many`` returned
    (the message is stored at POS), ``fail W.G.S`` when it raised, ``done`` at the end.
``python -m tests.stress.stream_proc reader URI DB STREAM --group NAME --log PATH [--idle S]``
    reads the group in batches; logs ``d W.G.S POS`` before it acks a message, ``a W.G.S POS`` once ``ack()``
    returned, ``x W.G.S`` when it
    raised ``LeaseLost``, and after each batch ``f`` once ``flush()`` wrote the acks, or ``f lost SEQ,...`` with
    the buckets whose lease was lost. With ``--idle`` it exits after that many seconds without a message.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import bucketq
from tests.stress.common import LineLog

# Short leases and gap wait: a killed reader's buckets, and a killed writer's holes, come back within seconds.
STREAM_OPTIONS = {"lease": 2.0, "state_flush_period": 0.4, "gap_wait": 3.0, "write_timeout": 2.5,
                  "bucket_max_size": 50, "bucket_max_wait": 0.05, "poll_interval": 0.05}
CHUNK = 10


async def write(args: argparse.Namespace, log: LineLog) -> None:
    async with bucketq.Stream(args.uri, name=args.stream, db=args.db, **STREAM_OPTIONS) as stream:
        started = time.monotonic()
        for first in range(0, args.count, CHUNK):
            ids = [f"{args.writer}.{args.gen}.{s}" for s in range(first, min(first + CHUNK, args.count))]
            try:
                positions = await stream.push_many([{"id": i} for i in ids])
            except bucketq.BucketqError:
                log.write_many([f"fail {i}" for i in ids])
                continue
            log.write_many([f"ok {i} {p}" for i, p in zip(ids, positions, strict=True)])
            if args.rate:
                await asyncio.sleep(max(0.0, started + (first + CHUNK) / args.rate - time.monotonic()))
    log.write("done")


async def read(args: argparse.Namespace, log: LineLog) -> None:
    async with bucketq.Stream(args.uri, name=args.stream, db=args.db, **STREAM_OPTIONS) as stream:
        reader = stream.reader(args.group, start="beginning")
        quiet_since = time.monotonic()
        while args.idle is None or time.monotonic() - quiet_since < args.idle:
            batch = await reader.read_many(25, timeout=0.5)
            if batch:
                quiet_since = time.monotonic()
            for message in batch:
                log.write(f"d {message.payload['id']} {message.position}")
                try:
                    await message.ack()
                except bucketq.LeaseLost:
                    log.write(f"x {message.payload['id']}")
                    continue
                log.write(f"a {message.payload['id']} {message.position}")
            lost = await reader.flush()
            log.write(f"f lost {','.join(str(p.seq) for p in lost)}" if lost else "f")  # one partition here
        await reader.close()
    log.write("done")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("writer", "reader"))
    parser.add_argument("uri")
    parser.add_argument("db")
    parser.add_argument("stream")
    parser.add_argument("--log", required=True)
    parser.add_argument("--writer", type=int, default=0)
    parser.add_argument("--gen", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--group", default="")
    parser.add_argument("--idle", type=float, default=None)
    args = parser.parse_args()
    log = LineLog(args.log)
    asyncio.run(write(args, log) if args.role == "writer" else read(args, log))
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Instructions a consumed message costs the client (bench/README.md, Profiling the client's CPU), counted by
callgrind, which a shared machine's load does not move as it moves CPU seconds.

For each of two queue sizes: fill a queue with 1 KiB messages (buckets of 1,024; untimed, in this process), then
consume all of it in a child process run under ``valgrind --tool=callgrind``, as the bench's consume roles do (16
tasks of ``reserve`` + ``ack``, or of ``reserve_many(batch)`` + an ack of each or, ``--ack-many``, one ``ack_many``
of the batch; ``--batch 0``: the floor's ``find_one_and_delete`` of each bucket and ``orjson.loads`` of each
payload). The smaller run is subtracted from the larger, so that start-up, imports and set-up cancel out. Against
``BUCKETQ_MONGODB_URI`` or an embedded test server (``bench.server``). ``PYTHONPATH`` chooses the code measured,
e.g. a copy of main's tree for "before".

    python -m bench.profiling.consume_instructions [--batch 1] [--ack-many] [--messages 8192,24576]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DB = "bucketq_bench"  # the bench's database, dropped by bench.server around its runs
TASKS = 16
PAD = "x" * (1024 - 40)  # with the bench's other fields, about 1 KiB of JSON


async def fill(uri: str, queue: str, n: int) -> None:
    import bucketq
    from bench.worker import payload

    q = bucketq.Queue(uri, name=queue, db=DB, bucket_max_size=1024, bucket_max_wait=0.5)
    for start in range(0, n, 4096):
        await q.push_many([payload(i, PAD) for i in range(start, min(n, start + 4096))])
    await q.close()


async def consume(uri: str, queue: str, batch: int, ack_many: bool) -> int:
    """Every message of ``queue``, acked one by one (or each batch by ``ack_many``); the count."""
    import bucketq

    q = bucketq.Queue(uri, name=queue, db=DB, bucket_max_size=1024, bucket_max_wait=0.5)
    count = 0

    async def task() -> None:  # as the bench's consume roles (bench/contenders/bucketq_c.py)
        nonlocal count
        while True:
            if batch == 1:
                if (message := await q.reserve(timeout=0.5)) is None:
                    return
                await message.ack()
                count += 1
                continue
            if not (messages := await q.reserve_many(batch, timeout=0.5)):
                return
            if ack_many:
                await q.ack_many(messages)
            else:
                for message in messages:
                    await message.ack()
            count += len(messages)

    await asyncio.gather(*(task() for _ in range(TASKS)))
    await q.close()
    return count


def consume_floor(uri: str, queue: str) -> int:
    import orjson
    from pymongo import MongoClient

    count = 0
    with MongoClient(uri) as client:
        while (bucket := client[DB][queue].find_one_and_delete({"fin": {"$exists": False}})) is not None:
            for stored in bucket["p"]:
                orjson.loads(stored)
                count += 1
    return count


def counted(module: str, *args: str) -> tuple[int, int]:
    """(instructions, messages) of a child process ``python -m module --child *args`` under callgrind, which ends
    by printing its message count as ``done N``."""
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={Path(tmp) / 'out'}",
                              sys.executable, "-m", module, "--child", *args],
                             capture_output=True, text=True, check=True)
    instructions = re.search(r"Collected : (\d+)", run.stderr)
    done = re.search(r"^done (\d+)$", run.stdout, re.MULTILINE)
    if instructions is None or done is None:
        raise RuntimeError(f"the child's output says neither its instructions nor its count: {run.stderr[-2000:]}")
    return int(instructions.group(1)), int(done.group(1))


def per_message(runs: list[tuple[int, int]]) -> float:
    """Instructions a message: the smaller run subtracted from the larger (start-up, imports, set-up cancel out)."""
    (small, n_small), (large, n_large) = runs
    return (large - small) / (n_large - n_small)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1, help="messages per reserve_many (1: reserve); 0: the floor")
    parser.add_argument("--ack-many", action="store_true", help="ack each batch by Queue.ack_many")
    parser.add_argument("--messages", default="8192,24576", help="the two queue sizes, smaller first")
    parser.add_argument("--child", nargs=2, metavar=("URI", "QUEUE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        uri, queue = args.child
        n = consume_floor(uri, queue) if args.batch == 0 else \
            asyncio.run(consume(uri, queue, args.batch, args.ack_many))
        print(f"done {n}")
        return
    from bench.server import server

    sizes = [int(n) for n in args.messages.split(",")]
    runs = []
    with server() as srv:
        srv.drop_bench_db()
        for n in sizes:
            queue = f"instructions{n}"
            asyncio.run(fill(srv.uri, queue, n))
            runs.append(counted(__spec__.name, srv.uri, queue, "--batch", str(args.batch),
                                *(["--ack-many"] if args.ack_many else [])))
            print(f"{n} messages: {runs[-1][0]:,} instructions, {runs[-1][1]:,} consumed", flush=True)
        srv.drop_bench_db()
    print(f"per message: {per_message(runs):,.0f} instructions")


if __name__ == "__main__":
    main()

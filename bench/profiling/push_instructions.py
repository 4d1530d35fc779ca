"""Instructions a pushed message costs the client, counted by callgrind as
``bench.profiling.consume_instructions`` counts a consumed one.

For each of two message counts, a child process run under ``valgrind --tool=callgrind`` pushes that many 1 KiB
messages into an empty queue (buckets of 1,024) as the bench's roles do, then drains: ``--mode nowait``, the
``push`` role (``push_nowait`` of each payload as it is built, at most 4,096 unacknowledged, the oldest awaited on
``BufferFull``); ``--mode many``, the ``push_many`` role (calls of 4,096, each awaited); ``--mode floor``, the
floor's ``insert_many`` of 4 buckets of 1,024 at a time through the sync driver, its buckets BSON-encoded by this
process beforehand and read by the child from a file (as the floor builds them before its clock starts). The
smaller run is subtracted from the larger. Against ``BUCKETQ_MONGODB_URI`` or an embedded test server.

    python -m bench.profiling.push_instructions [--mode nowait|many|floor] [--messages 8192,24576]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import tempfile
from pathlib import Path

from bench.profiling.consume_instructions import DB, PAD, counted, per_message

WINDOW = 4096  # the bench's un-acknowledged pushes at most, and its push_many call size
BUCKET = 1024


async def push(uri: str, queue: str, n: int, many: bool) -> None:
    import bucketq
    from bench.worker import payload

    q = bucketq.Queue(uri, name=queue, db=DB, bucket_max_size=BUCKET, bucket_max_wait=0.5)
    if many:
        for start in range(0, n, WINDOW):
            await q.push_many([payload(i, PAD) for i in range(start, min(n, start + WINDOW))])
    else:
        pending: collections.deque[asyncio.Future[str]] = collections.deque()
        for i in range(n):
            while True:
                try:
                    pending.append(q.push_nowait(payload(i, PAD)))
                    break
                except bucketq.BufferFull:
                    await pending.popleft()
            if len(pending) >= WINDOW:
                await pending.popleft()
        while pending:
            await pending.popleft()
    await q.drain()
    await q.close()


def floor_buckets(path: Path, n: int) -> None:
    """``n`` messages as the floor's buckets, BSON-encoded one after another into ``path``."""
    import bson
    import orjson

    from bench.worker import payload

    now = dt.datetime.now(dt.timezone.utc)
    with path.open("wb") as out:
        for start in range(0, n, BUCKET):
            msgs = [orjson.dumps(payload(i, PAD)) for i in range(start, min(n, start + BUCKET))]
            out.write(bson.encode({"_id": bson.ObjectId(), "mature": now, "n": len(msgs), "b": msgs}))


def push_floor(uri: str, queue: str, path: Path) -> None:
    import bson
    from bson.raw_bson import RawBSONDocument
    from pymongo import MongoClient

    options = bson.CodecOptions(document_class=RawBSONDocument)
    buckets = list(bson.decode_file_iter(path.open("rb"), options))
    per_call = WINDOW // BUCKET
    with MongoClient(uri) as client:
        for k in range(0, len(buckets), per_call):
            client[DB][queue].insert_many(buckets[k:k + per_call])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("nowait", "many", "floor"), default="nowait")
    parser.add_argument("--messages", default="8192,24576", help="the two message counts, smaller first")
    parser.add_argument("--child", nargs=3, metavar=("URI", "QUEUE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)  # the floor's buckets
    args = parser.parse_args(argv)
    if args.child:
        uri, queue, n = args.child
        if args.mode == "floor":
            push_floor(uri, queue, Path(args.file))
        else:
            asyncio.run(push(uri, queue, int(n), args.mode == "many"))
        print(f"done {n}")
        return
    from bench.server import server

    runs = []
    with server() as srv, tempfile.TemporaryDirectory() as tmp:
        srv.drop_bench_db()
        for n in (int(n) for n in args.messages.split(",")):
            extra = ["--mode", args.mode]
            if args.mode == "floor":
                floor_buckets(path := Path(tmp) / f"buckets{n}", n)
                extra += ["--file", str(path)]
            runs.append(counted(__spec__.name, srv.uri, f"instructions{n}", str(n), *extra))
            print(f"{n} messages: {runs[-1][0]:,} instructions, {runs[-1][1]:,} pushed", flush=True)
        srv.drop_bench_db()
    print(f"per message: {per_message(runs):,.0f} instructions")


if __name__ == "__main__":
    main()

"""The many-consumers cell: 8 consumer processes drain one backlog, on 1 partition and on 8,
in the same run and against the same server, and the claim conflicts per bucket of each are reported.

``python -m bench.conflicts [--consumers 8] [--partitions 1,8] [--buckets 2000] [--bucket-size 20]``

A *conflict* is a claim that took no bucket while the backlog still held due buckets (all consumers raced
for the same first bucket, or, with partitions, the partition tried was empty while others were not), plus
the write conflicts a real mongod retries inside a claim (``serverStatus().metrics.operation.writeConflicts``,
which the test server does not report: "n/a"). Also reported: commands and client CPU per 1,000 messages, the
inputs of docs/SCALING.md's capacity model. Each consumer stops after its first round that found nothing in
any partition once the backlog is gone; the claims of that last round are not conflicts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from typing import Any

from pymongo import AsyncMongoClient, MongoClient, monitoring

from bench.server import DB, server

QUEUE = "conflicts"


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def _consume(uri: str, partitions: int, start: Any) -> dict[str, Any]:
    import bucketq

    commands = _Commands()
    client: AsyncMongoClient = AsyncMongoClient(uri, event_listeners=[commands])
    queue = bucketq.Queue(client, name=QUEUE, db=DB, partitions=partitions, change_streams=False)
    await queue.stats()  # set up before the start
    start.wait()
    cpu0, commands.count, messages, empty_while_due = time.process_time(), 0, 0, 0
    while True:
        before = queue._consumer.claim_counts[False]
        message = await queue.reserve(timeout=0)
        if message is None:
            break
        await message.ack()
        messages += 1
        empty_while_due += queue._consumer.claim_counts[False] - before  # a bucket was found after them
    await queue.drain()
    counts = queue._consumer.claim_counts
    result = {"messages": messages, "claims": counts[True] + counts[False], "found": counts[True],
              "empty_while_due": empty_while_due, "commands": commands.count, "cpu_s": time.process_time() - cpu0}
    await queue.close()
    await client.close()
    return result


def _worker(uri: str, partitions: int, start: Any, out: Any) -> None:
    out.put(asyncio.run(_consume(uri, partitions, start)))


def _write_conflicts(client: MongoClient) -> int | None:
    metrics = client.admin.command("serverStatus").get("metrics", {})
    value = metrics.get("operation", {}).get("writeConflicts")
    return int(value) if value is not None else None


async def _fill(uri: str, partitions: int, buckets: int, size: int) -> None:
    import bucketq

    async with bucketq.Queue(uri, name=QUEUE, db=DB, partitions=partitions, bucket_max_size=size,
                             bucket_max_wait=5) as queue:
        for b in range(buckets):
            await queue.push_many([{"b": b, "i": i} for i in range(size)])


def cell(uri: str, partitions: int, consumers: int, buckets: int, size: int) -> dict[str, Any]:
    with MongoClient(uri) as client:
        client.drop_database(DB)
        asyncio.run(_fill(uri, partitions, buckets, size))
        conflicts0 = _write_conflicts(client)
        context = multiprocessing.get_context("spawn")
        start, out = context.Event(), context.Queue()
        procs = [context.Process(target=_worker, args=(uri, partitions, start, out)) for _ in range(consumers)]
        for proc in procs:
            proc.start()
        time.sleep(3)  # every consumer set up (spawn, import, connect) before the start
        began = time.monotonic()
        start.set()
        results = [out.get(timeout=600) for _ in procs]
        elapsed = time.monotonic() - began
        for proc in procs:
            proc.join()
        conflicts1 = _write_conflicts(client)
        client.drop_database(DB)
    messages = sum(r["messages"] for r in results)
    found = sum(r["found"] for r in results)
    empty = sum(r["empty_while_due"] for r in results)
    return {
        "partitions": partitions, "consumers": consumers, "buckets": buckets, "messages": messages,
        "msgs_per_s": round(messages / elapsed), "claims_found": found,
        "empty_claims_while_due": empty, "conflicts_per_bucket": round(empty / max(1, found), 4),
        "server_write_conflicts": None if conflicts0 is None or conflicts1 is None else conflicts1 - conflicts0,
        "commands_per_1000": round(1000 * sum(r["commands"] for r in results) / max(1, messages), 1),
        "client_cpu_us_per_msg": round(1e6 * sum(r["cpu_s"] for r in results) / max(1, messages), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conflicts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--partitions", default="1,8", help="comma list; each a cell of the same run")
    parser.add_argument("--buckets", type=int, default=2000)
    parser.add_argument("--bucket-size", type=int, default=20, help="messages per bucket")
    args = parser.parse_args()
    with server() as srv:
        print(f"server: {srv.label}")
        for partitions in (int(p) for p in args.partitions.split(",")):
            row = cell(srv.uri, partitions, args.consumers, args.buckets, args.bucket_size)
            print(f"{args.consumers} consumers, {partitions} partition(s): {json.dumps(row)}", flush=True)

if __name__ == "__main__":
    main()

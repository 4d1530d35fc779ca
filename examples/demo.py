"""``make demo``: the main job end to end on the embedded test server (or ``BUCKETQ_MONGODB_URI``).

1. produce: a producer pushes N account events and drains; prints messages, buckets, bytes, msg/s and
   server commands per 1,000 messages;
2. consume: asyncio consumers reserve and ack them all, totalling amounts per account; prints msg/s and
   commands per 1,000 messages;
3. spark: the same events are pushed again and the example Spark job (claim → read through the MongoDB
   Spark Connector → aggregate → Parquet → commit) totals them; the demo checks both totals agree. With
   ``--cluster`` (``make demo-cluster``) the job runs under ``spark-submit`` on a standalone Spark cluster
   started here (a Master and a Worker of the installed pyspark), and the demo also checks that the master
   ran it on its executors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from typing import Any

from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, MongoClient, monitoring

import bucketq
from bucketq_spark.status_line import StatusLine

DB = "bucketq_demo"
QUEUE = "events"
ACCOUNTS = 50


class CommandCounter(monitoring.CommandListener):
    """Counts the commands a client sends (the change stream's getMores are counted apart)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> Counter[str]:
        taken, self.counts = self.counts, Counter()
        return taken


def events(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"account": f"acct-{rng.randrange(ACCOUNTS):02d}", "amount": round(rng.uniform(1, 500), 2), "seq": i,
             "ts": time.time()} for i in range(n)]


def progress(status: StatusLine, label: str, done: int, total: int, started: float) -> None:
    rate = done / max(1e-9, time.perf_counter() - started)
    status.show(f"  {label}: {done:,}/{total:,} ({rate:,.0f} msg/s)")


def per_1000(counts: Counter[str], messages: int, *, skip: tuple[str, ...] = ("getMore", "aggregate")) -> float:
    return 1000 * sum(v for k, v in counts.items() if k not in skip) / messages


async def produce(q: bucketq.Queue, payloads: list[dict[str, Any]], label: str) -> float:
    started = time.perf_counter()
    status = StatusLine()
    step = 10_000
    for i in range(0, len(payloads), step):
        await q.push_many(payloads[i:i + step])
        progress(status, label, min(i + step, len(payloads)), len(payloads), started)
    await q.flush()
    status.end()
    return time.perf_counter() - started


async def consume(q: bucketq.Queue, total: int, consumers: int) -> tuple[float, dict[str, list[float]]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    done = 0
    started = time.perf_counter()
    status = StatusLine()

    async def run() -> None:
        nonlocal done
        while done < total and (message := await q.reserve(timeout=2)) is not None:
            entry = totals[message.payload["account"]]
            entry[0] += 1
            entry[1] += message.payload["amount"]
            await message.ack()
            done += 1
            if done % 10_000 == 0:
                progress(status, "consumed", done, total, started)

    await asyncio.gather(*(run() for _ in range(consumers)))
    elapsed = time.perf_counter() - started
    progress(status, "consumed", done, total, started)
    status.end()
    await q.drain()  # writes the last acks
    return elapsed, dict(totals)


def stored_size(uri: str) -> tuple[int, int]:
    client: MongoClient = MongoClient(uri, document_class=RawBSONDocument)
    try:
        docs = list(client[DB][QUEUE].find())
        return len(docs), sum(len(d.raw) for d in docs)
    finally:
        client.close()


async def produce_and_consume(uri: str, n: int, consumers: int) -> dict[str, Any]:
    counter = CommandCounter()
    client: AsyncMongoClient = AsyncMongoClient(uri, event_listeners=[counter], tz_aware=True)
    await client.drop_database(DB)
    payloads = events(n)
    producer = bucketq.Queue(client, name=QUEUE, db=DB)
    await producer._ready()  # setup commands (clock, indexes) are not per-message costs
    counter.take()
    seconds = await produce(producer, payloads, "pushed")
    push_commands = counter.take()
    await producer.close()
    buckets, size = stored_size(uri)
    print(f"produce: {n:,} messages in {buckets} buckets, {size / 1e6:.1f} MB, {seconds:.2f} s, "
          f"{n / seconds:,.0f} msg/s, {per_1000(push_commands, n):.2f} server commands per 1,000 messages "
          f"({dict(push_commands)})")

    consumer = bucketq.Queue(client, name=QUEUE, db=DB)
    await consumer._ready()
    counter.take()
    seconds, totals = await consume(consumer, n, consumers)
    pull_commands = counter.take()
    await consumer.close()
    print(f"consume: {sum(t[0] for t in totals.values()):,} messages with {consumers} consumers in {seconds:.2f} s, "
          f"{n / seconds:,.0f} msg/s, {per_1000(pull_commands, n):.2f} server commands per 1,000 messages "
          f"({dict(pull_commands)}; change-stream getMores not counted)")

    again = bucketq.Queue(client, name=QUEUE, db=DB)
    await produce(again, payloads, "pushed again for Spark")
    await again.close()
    await client.close()
    return totals


def run_spark(uri: str, expected: dict[str, list[float]]) -> None:
    from bucketq_spark.job import format_progress
    from devtools.jars import ROOT, ensure_jars

    if str(ROOT / "spark") not in sys.path:
        sys.path.insert(0, str(ROOT / "spark"))  # the example job (spark/jobs) is not an installed package
    from jobs.account_totals import run_example_job

    status = StatusLine()

    def show(event: dict[str, Any]) -> None:
        status.show(f"  spark: {format_progress(event)}")

    with tempfile.TemporaryDirectory(prefix="bucketq-demo-") as out:
        figures = run_example_job(uri, DB, QUEUE, out, progress=show, jars=ensure_jars("spark"))
    status.end()
    steps = ", ".join(f"{k} {v:.2f} s" for k, v in figures["seconds"].items())
    print(f"spark:   {figures['rows']:,} messages from {figures['buckets']} buckets in {figures['batches']} batch(es), "
          f"{figures['rows_per_s']:,.0f} rows/s; {steps}")
    check_totals(figures["accounts"], expected)


def check_totals(accounts: list[dict[str, Any]], expected: dict[str, list[float]]) -> None:
    """Print the first accounts of the Spark job's totals and exit unless every account's equal the consumer's."""
    print(f"  {'account':<10} {'count':>7} {'amount':>14}")
    for row in accounts[:5]:
        print(f"  {row['account']:<10} {row['count']:>7,} {row['amount']:>14,.2f}")
    print(f"  ... {len(accounts)} accounts")
    mismatched = [r["account"] for r in accounts
                  if r["count"] != expected[r["account"]][0] or abs(r["amount"] - expected[r["account"]][1]) > 0.01]
    if mismatched or len(accounts) != len(expected):
        raise SystemExit(f"Spark totals differ from the consumer's for {mismatched or 'the account list'}")
    print("spark totals equal the asyncio consumer's totals for every account")


def run_spark_cluster(uri: str, expected: dict[str, list[float]]) -> None:
    """The same job under ``spark-submit`` on a standalone cluster (a Master and a Worker of the installed pyspark,
    on 127.0.0.1, stopped by PID); checks that the master ran it and executors did the work."""
    from devtools.jars import ROOT, ensure_jars
    from devtools.sparkcluster import SparkCluster, submit, submit_command

    with SparkCluster() as cluster, tempfile.TemporaryDirectory(prefix="bucketq-demo-") as out:
        print(f"spark cluster: master {cluster.master_url} (pid {cluster.pids['master']}), "
              f"worker pid {cluster.pids['worker']}")
        command = submit_command(cluster.master_url, ensure_jars("spark"), ROOT / "spark/jobs/account_totals.py",
                                 ["--uri", uri, "--db", DB, "--queue", QUEUE, "--out", out], name="bucketq-demo")
        print("  " + " ".join(command[:1] + ["..."] + command[-9:]), file=sys.stderr)
        job = submit(command, stdout=subprocess.PIPE)
        stdout, _ = job.communicate()
        if job.returncode != 0:
            raise SystemExit(f"spark-submit exited with {job.returncode}")
        report = parse_job_output(stdout)
        apps = [a["name"] for a in cluster.state().get("completedapps", [])]
    print(f"spark cluster: {report['summary']}")
    print(f"  {report['executors']}; the master's completed applications: {apps}")
    if "bucketq-demo" not in apps or "none" in report["executors"]:
        raise SystemExit("the job did not run on the cluster's executors")
    check_totals(report["accounts"], expected)


def parse_job_output(stdout: str) -> dict[str, Any]:
    """The account_totals (or stream_totals) job's printed report: its summary line, its executors line and the
    accounts. spark-submit passes the job's progress (its stderr: plain lines there, not a terminal) on to stdout."""
    lines = [line.strip() for line in stdout.splitlines()]
    accounts = [{"account": a, "count": int(c), "amount": float(m)}
                for a, c, m in (line.split("\t") for line in lines if line.count("\t") == 2)]
    executors = next((line for line in lines if line.startswith("master ")), "executors: none")
    summary = next((line for line in lines if " batch(es), " in line), "")
    return {"summary": summary, "executors": executors, "accounts": accounts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark step")
    parser.add_argument("--cluster", action="store_true",
                        help="run the Spark job with spark-submit on a standalone cluster started here")
    args = parser.parse_args()
    with ExitStack() as stack:
        uri = os.environ.get("BUCKETQ_MONGODB_URI")
        if uri:
            print(f"server: {uri} (BUCKETQ_MONGODB_URI)")
        else:
            from devtools.testserver import TestServer

            server = stack.enter_context(TestServer())
            uri = server.uri
            print(f"server: mongo-java-server (embedded test server, in memory) at {uri}, pid {server.pid}")
        totals = asyncio.run(produce_and_consume(uri, args.messages, args.consumers))
        if args.cluster:
            run_spark_cluster(uri, totals)
        elif not args.no_spark:
            run_spark(uri, totals)
        MongoClient(uri).drop_database(DB)


if __name__ == "__main__":
    main()

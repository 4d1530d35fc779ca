"""Example job: count and sum of ``amount`` per account over the events of a bucketq queue, into Parquet.

    python spark/jobs/account_totals.py --uri mongodb://localhost:27017 --db demo --queue events --out /tmp/totals \
        --jars .cache/jars/spark      # or $BUCKETQ_SPARK_JARS; `make jars` fetches them

or on a cluster, with the jars given to spark-submit (see spark/README.md):

    spark-submit --master spark://host:7077 --jars <the five jars, comma-separated> spark/jobs/account_totals.py \
        --uri mongodb://... --db demo --queue events --out /shared/totals

Events (JSON payloads, codec "json"): ``{"account": "acct-17", "amount": 12.5, "seq": 123, "ts": 1716980000.25}``
(``ts``: Unix seconds, float; ``seq``: the producer's sequence number). Payloads are decoded with
``EVENT_SCHEMA``; a missing field reads as null, and a payload that does not parse with it (a mistyped field,
invalid JSON) goes to the queue's quarantine instead of the totals.

Each batch writes *partial* totals per (bucket_id, account) to ``out_dir`` partitioned by ``bucket_id``
(dynamic partition overwrite: a re-run of a bucket replaces its partials, never adds to them). The totals per
account are the partials summed at read time (``account_totals``). Not part of the ``bucketq_spark`` package:
with ``spark/`` on ``sys.path`` it imports as ``jobs.account_totals`` (the demo and the tests do that).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bucketq_spark.job import STEPS, BatchJob, Progress, format_progress
from bucketq_spark.reader import ReadOptions
from bucketq_spark.session import describe_executors, executor_ids
from bucketq_spark.sinks import ParquetSink
from bucketq_spark.status_line import StatusLine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EVENT_SCHEMA = "account STRING, amount DOUBLE, seq LONG, ts DOUBLE"


def account_partials(messages: DataFrame) -> DataFrame:
    """process(): count and sum of amount per (bucket_id, account)."""
    from pyspark.sql import functions as F

    return (messages.select("bucket_id", F.col("payload.account").alias("account"),
                            F.col("payload.amount").alias("amount"))
            .groupBy("bucket_id", "account")
            .agg(F.count(F.lit(1)).alias("count"), F.sum("amount").alias("amount")))


def account_totals(partials: DataFrame) -> DataFrame:
    """The partials of every bucket written so far, rolled up per account."""
    from pyspark.sql import functions as F

    return (partials.groupBy("account")
            .agg(F.sum("count").alias("count"), F.sum("amount").alias("amount"))
            .orderBy("account"))


def run_example_job(uri: str, db: str, queue: str, out_dir: str | Path, *, spark: SparkSession | None = None,
                    max_buckets: int = 256, max_batches: int | None = None, lease: float = 300.0,
                    max_attempts: int = 5, partitions: int | None = None, progress: Progress | None = None,
                    jars: Sequence[str | os.PathLike[str]] | None = None) -> dict[str, Any]:
    """Run batches until no bucket of ``queue`` is due; return the figures and the totals per account.

    Without ``spark`` a session is built (``build_session(jars)``) and stopped at the end. ``progress`` gets the
    events of ``BatchJob`` (``bucketq_spark.job.format_progress`` renders one as a line).
    Returns ``{"master", "executors" (``executor_ids``), "batches", "buckets", "rows", "malformed" (messages
    quarantined as unparsable), "out_rows",
    "committed", "quarantined", "failed_batches", "errors",
    "seconds": {"session", "claim", "read", "process", "write", "commit", "rollup", "total"}, "rows_per_s"
    (rows over the five steps' seconds),
    "accounts": [{"account", "count", "amount"}, ...] (everything in ``out_dir``, sorted), "out_dir"}``.
    """
    started = time.perf_counter()
    own_session = spark is None
    if spark is None:
        from bucketq_spark.session import build_session

        if progress is not None:
            progress({"batch": 0, "step": "session", "state": "start", "elapsed_s": 0.0})
        spark = build_session(jars, app_name="bucketq-example")
    session_s = time.perf_counter() - started
    if own_session and progress is not None:
        progress({"batch": 0, "step": "session", "state": "done", "elapsed_s": session_s})
    sink = ParquetSink(str(out_dir))
    try:
        with BatchJob(spark, uri, db, queue, payload_schema=EVENT_SCHEMA, process=account_partials, sink=sink,
                      max_buckets=max_buckets, lease=lease, max_attempts=max_attempts,
                      read=ReadOptions(partitions=partitions), progress=progress) as job:
            results = job.run(max_batches)
        seconds = {step: sum(r.seconds[step] for r in results) for step in STEPS}
        rows = sum(r.rows for r in results)
        work_s = sum(seconds.values())
        rollup_started = time.perf_counter()
        accounts: list[dict[str, Any]] = []
        if Path(out_dir).exists():
            accounts = [row.asDict() for row in account_totals(sink.read(spark)).collect()]
        seconds["rollup"] = time.perf_counter() - rollup_started
        return {
            "master": spark.sparkContext.master,
            "executors": executor_ids(spark),
            "batches": len(results),
            "buckets": sum(r.buckets for r in results),
            "rows": rows,
            "malformed": sum(r.malformed for r in results),
            "out_rows": sum(r.out_rows for r in results),
            "committed": sum(r.committed for r in results),
            "quarantined": sum(len(r.quarantined) for r in results),
            "failed_batches": sum(1 for r in results if r.error),
            "errors": [r.error for r in results if r.error],
            "seconds": {"session": session_s, **seconds, "total": time.perf_counter() - started},
            "rows_per_s": rows / work_s if work_s > 0 else 0.0,
            "accounts": accounts,
            "out_dir": str(out_dir),
        }
    finally:
        if own_session:
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--queue", default="events")
    parser.add_argument("--out", required=True, help="Parquet output directory")
    parser.add_argument("--max-buckets", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--jars", action="append", default=None,
                        help="connector jar or directory of jars (repeatable); default $BUCKETQ_SPARK_JARS")
    args = parser.parse_args(argv)

    status = StatusLine()

    def progress(event: dict) -> None:
        if event["state"] != "start":
            status.show(format_progress(event))

    result = run_example_job(args.uri, args.db, args.queue, args.out, max_buckets=args.max_buckets,
                             partitions=args.partitions, progress=progress, jars=args.jars)
    status.end()
    steps = ", ".join(f"{k} {v:.2f}s" for k, v in result["seconds"].items())
    print(f"{result['batches']} batch(es), {result['buckets']} buckets, {result['rows']} rows "
          f"({result['rows_per_s']:,.0f} rows/s, {result['malformed']} malformed: quarantined); {steps}")
    print(f"master {result['master']}, executors: {describe_executors(result['executors'])}")
    for err in result["errors"]:
        print(f"failed batch: {err}")
    for row in result["accounts"]:
        print(f"{row['account']}\t{row['count']}\t{row['amount']:.2f}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

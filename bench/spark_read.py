"""Spark read path: rows/s through the MongoDB Spark Connector from bucket documents vs one document per
message, both filled with the same messages. Skipped, with the reason, when ``pyspark`` or ``bucketq_spark``
does not import.

``time_read_paths`` fills a bucketq queue (the real producer) and a flat collection (the naive layout of
``bench/contenders/naive.py``: ``{"_id", "mature", "tries", "payload": {...}}``, the payload a BSON document)
with the same payloads, then times, per layout, a read of every message through the connector that decodes
each payload: buckets -> ``explode_messages`` (``from_json``) vs flat docs -> ``payload`` struct; both end in
``count`` and ``sum(payload.i)``. The fill is not timed. Each layout is read once untimed first (a fresh JVM
would otherwise charge its JIT and code-generation warm-up to whichever layout goes first), then the layouts
are read in turn, ``repeats`` times, and the best read of each is reported.

On its own, for the read path only (``make bench-quick``'s settings by default; both layouts in one run, since
the machine's load changes from minute to minute): ``python -m bench.spark_read [--messages 20000]
[--payload-bytes 1024] [--repeats 3] [--partitions N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import time
from typing import TYPE_CHECKING, Any

from bench.plan import Job, Settings, skip_row
from bench.server import Server, server

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LAYOUTS = {"bucketq": "bucket documents", "naive": "one document per message"}
SPARK_MESSAGES = 50_000
PAYLOAD_SCHEMA = "i LONG, ts DOUBLE, pad STRING"
FLAT_SCHEMA = "_id STRING, payload STRUCT<i: LONG, ts: DOUBLE, pad: STRING>"


def _payloads(n: int, payload_bytes: int) -> list[dict[str, Any]]:
    pad = "x" * max(0, payload_bytes - 40)
    now = time.time()
    return [{"i": i, "ts": now, "pad": pad} for i in range(n)]


async def _fill_queue(uri: str, db: str, queue: str, payloads: list[dict[str, Any]], bucket_size: int) -> None:
    import bucketq

    q = bucketq.Queue(uri, name=queue, db=db, bucket_max_size=bucket_size, bucket_max_wait=0.05)
    try:
        for start in range(0, len(payloads), 10_000):
            await q.push_many(payloads[start:start + 10_000])
    finally:
        await q.close()


def _fill_flat(uri: str, db: str, collection: str, payloads: list[dict[str, Any]]) -> None:
    from pymongo import MongoClient

    now = dt.datetime.now(dt.timezone.utc)
    with MongoClient(uri) as client:
        coll = client[db][collection]
        for start in range(0, len(payloads), 5_000):
            coll.insert_many([{"mature": now, "tries": 0, "payload": p} for p in payloads[start:start + 5_000]])


def _timed(df: DataFrame) -> tuple[int, float]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum("payload.i").alias("s")).collect()[0]
    return int(row.n), time.perf_counter() - started


def time_read_paths(spark: SparkSession, uri: str, db: str, n_messages: int, *, payload_bytes: int = 100,
                    bucket_size: int = 1024, partitions: int | None = None, repeats: int = 2,
                    queue: str = "readbench", cleanup: bool = True) -> dict[str, Any]:
    """Rows/s reading ``n_messages`` messages from buckets (``queue``) and from a flat collection
    (``<queue>_flat``) in database ``db``. ``partitions`` as in ``ReadOptions`` (None: the default parallelism).

    Returns ``{"messages", "payload_bytes", "bucket_size", "partitions",
    "bucketq": {"docs", "rows", "seconds", "rows_per_s"}, "naive": {...}, "speedup"}``
    (``speedup`` = bucketq rows/s over naive rows/s). With ``cleanup`` both collections are dropped after.
    """
    from pymongo import MongoClient

    from bucketq_spark.reader import ReadOptions, explode_messages, read_buckets

    flat = f"{queue}_flat"
    payloads = _payloads(n_messages, payload_bytes)
    asyncio.run(_fill_queue(uri, db, queue, payloads, bucket_size))
    _fill_flat(uri, db, flat, payloads)
    read = ReadOptions(partitions=partitions)
    with MongoClient(uri) as client:
        n_buckets = client[db][queue].count_documents({})
    try:
        def buckets() -> DataFrame:
            return explode_messages(read_buckets(spark, uri, db, queue, expected_docs=n_buckets, read=read),
                                    PAYLOAD_SCHEMA)

        def naive() -> DataFrame:
            return (spark.read.format("mongodb").schema(FLAT_SCHEMA)
                    .option("connection.uri", uri).option("database", db).option("collection", flat)
                    .options(**read.reader_options(n_messages, spark.sparkContext.defaultParallelism)).load())

        out: dict[str, Any] = {"messages": n_messages, "payload_bytes": payload_bytes, "bucket_size": bucket_size,
                               "partitions": partitions}
        layouts = {"bucketq": (buckets, n_buckets), "naive": (naive, n_messages)}
        best: dict[str, float] = {}
        for round_ in range(1 + max(1, repeats)):
            for name, (make, _) in layouts.items():
                rows, seconds = _timed(make())
                if rows != n_messages:
                    raise RuntimeError(f"{name}: read {rows} rows, expected {n_messages}")
                if round_ > 0:  # round 0 warms up
                    best[name] = min(best.get(name, seconds), seconds)
        for name, (_, docs) in layouts.items():
            out[name] = {"docs": docs, "rows": n_messages, "seconds": best[name],
                         "rows_per_s": n_messages / best[name] if best[name] else 0.0}
        naive_rate = out["naive"]["rows_per_s"]
        out["speedup"] = out["bucketq"]["rows_per_s"] / naive_rate if naive_rate else 0.0
        return out
    finally:
        if cleanup:
            with MongoClient(uri) as client:
                for name in (queue, f"{queue}.dead", f"{queue}.quarantine", f"{queue}.inbox", flat):
                    client[db].drop_collection(name)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that does not import
        return False


def measure(cfg: Settings, server: Server) -> dict:
    """Both layouts' rows/s from one Spark session: ``{"bucketq": {...}, "naive": {...}, "speedup"}``."""
    return _time(server.uri, min(cfg.messages, SPARK_MESSAGES), payload_bytes=cfg.payloads[0])


def _time(uri: str, messages: int, **options: object) -> dict:
    from bucketq_spark.session import build_session
    from devtools.jars import ensure_jars

    spark = build_session(ensure_jars("spark"))
    try:
        return time_read_paths(spark, uri, "bucketq_bench_spark", messages, **options)
    finally:
        spark.stop()


def rows(cfg: Settings, server: Server) -> list[dict]:
    missing = [name for name in ("pyspark", "bucketq_spark") if not _importable(name)]
    figures = None if missing else measure(cfg, server)
    out = []
    for contender in LAYOUTS:
        job = Job(contender, "spark_read", cfg.payloads[0], 1, min(cfg.messages, SPARK_MESSAGES))
        if figures is None:
            out.append(skip_row(job, f"skipped: {' and '.join(missing)} not importable"))
            continue
        row = skip_row(job, f"rows/s reading {LAYOUTS[contender]} through the Spark connector")
        row["msgs_per_s"] = figures[contender]["rows_per_s"]
        row["seconds"] = figures[contender]["seconds"]
        row["documents"] = figures[contender]["docs"]
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Spark read path only: bucket documents vs one document per message")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--bucket-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with server() as srv:
        out = _time(srv.uri, args.messages, payload_bytes=args.payload_bytes, bucket_size=args.bucket_size,
                    partitions=args.partitions, repeats=args.repeats)
        print(f"server: {srv.label}")
    for name in LAYOUTS:
        f = out[name]
        print(f"{name:8} {f['docs']:>7} docs  {f['rows']:>7} rows  {f['seconds']:7.3f} s  "
              f"{f['rows_per_s']:>10,.0f} rows/s")
    print(f"speedup (bucketq / naive): {out['speedup']:.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

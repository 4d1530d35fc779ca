"""Spark read path: rows/s through the MongoDB Spark Connector from bucket documents vs one document per
message, both filled with the same messages. Skipped, with the reason, when ``pyspark`` or ``bucketq_spark``
does not import.

``time_read_paths`` fills a bucketq queue (the real producer, codec ``bson`` by default: payloads stored as BSON
documents, which the connector maps to the payload struct; ``json``: JSON text decoded by ``from_json``) and a
flat collection (the naive layout of
``bench/contenders/naive.py``: ``{"_id", "mature", "tries", "payload": {...}}``, the payload a BSON document)
with the same payloads, then times, per layout, a read of every message through the connector that decodes
each payload: buckets -> ``explode_messages`` vs flat docs -> ``payload`` struct; both end in
``count`` and ``sum(payload.i)``. The fill is not timed. Each layout is read once untimed first (a fresh JVM
would otherwise charge its JIT and code-generation warm-up to whichever layout goes first), then the layouts
are read in turn, ``repeats`` times, and the best read of each is reported.

On its own, for the read path only (``make bench-quick``'s settings by default; both layouts in one run, since
the machine's load changes from minute to minute): ``python -m bench.spark_read [--messages 100000]
[--payload-bytes 1024] [--repeats 3] [--partitions N] [--codec bson|json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

from bench.plan import Job, Settings, skip_row
from bench.server import Server, process_cpu_s, server

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LAYOUTS = {"bucketq": "bucket documents", "naive": "one document per message"}
# Messages per layout, whatever --messages says: a Spark job reads in bulk. At 20,000 (20 buckets, two per
# partition) each bucket read was mostly its fixed cost (planning, code generation, the partitioner's queries:
# about 0.4 s of 0.6 s), and measured that, not the read.
SPARK_MESSAGES = 100_000
# The bucket layout's payload codec: bson, which the connector maps to columns (json: from_json, the codec before)
CODEC = "bson"
PAYLOAD_SCHEMA = "i LONG, ts DOUBLE, pad STRING"
PAYLOAD_FIELDS = ("i", "ts", "pad")
FLAT_SCHEMA = "_id STRING, payload STRUCT<i: LONG, ts: DOUBLE, pad: STRING>"


def _payloads(n: int, payload_bytes: int) -> list[dict[str, Any]]:
    pad = "x" * max(0, payload_bytes - 40)
    now = time.time()
    return [{"i": i, "ts": now, "pad": pad} for i in range(n)]


async def _fill_queue(uri: str, db: str, queue: str, payloads: list[dict[str, Any]], bucket_size: int,
                      codec: str) -> None:
    import bucketq

    q = bucketq.Queue(uri, name=queue, db=db, bucket_max_size=bucket_size, bucket_max_wait=0.05, codec=codec)
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


def _decoded(df: DataFrame) -> DataFrame:
    """Every payload field of every row, so that both layouts decode all of it."""
    from pyspark.sql import functions as F

    return df.select(*(F.col(f"payload.{f}").alias(f) for f in PAYLOAD_FIELDS))


def _summary(df: DataFrame) -> DataFrame:
    """The timed query: one row that depends on every decoded field of every row."""
    from pyspark.sql import functions as F

    return _decoded(df).agg(F.count(F.lit(1)).alias("n"), F.sum("i").alias("i"), F.sum("ts").alias("ts"),
                            F.sum(F.length("pad")).alias("pad"))


def _same_rows(a: DataFrame, b: DataFrame) -> None:
    """Raises unless ``a`` and ``b`` hold the same decoded rows (as multisets)."""
    for left, right, name in ((a, b, "bucketq"), (b, a, "naive")):
        extra = _decoded(left).exceptAll(_decoded(right)).limit(3).collect()
        if extra:
            raise AssertionError(f"{name} decoded rows the other layout lacks, e.g. {extra}")


def time_read_paths(spark: SparkSession, uri: str, db: str, n_messages: int, *, payload_bytes: int = 100,
                    bucket_size: int = 1024, partitions: int | None = None, repeats: int = 2,
                    queue: str = "readbench", cleanup: bool = True, server_pid: int | None = None,
                    codec: str = CODEC) -> dict[str, Any]:
    """Rows/s reading ``n_messages`` messages from buckets (``queue``) and from a flat collection
    (``<queue>_flat``) in database ``db``, the same payloads decoded by the same schema (``PAYLOAD_SCHEMA``).
    Both reads get the same ``ReadOptions(partitions=partitions)`` (None: ``ReadOptions``' policy, by documents
    and by bytes). Before the timing, the two layouts' decoded rows are checked equal (``AssertionError``).

    ``codec`` is the queue's payload codec (``read_buckets(codec=...)``).

    Returns ``{"messages", "payload_bytes", "bucket_size", "partitions", "rounds", "codec",
    "bucketq": {"docs", "partitions", "rows", "seconds", "rows_per_s", "median_s", "spark_cpu_s",
    "server_cpu_s", "best_cpu_s"}, "naive": {...}, "speedup", "median_speedup"}``: ``seconds`` is the best read
    (``best_cpu_s``: its Spark and server CPU seconds),
    ``speedup`` = bucketq rows/s over naive rows/s (best reads), ``median_speedup`` the median of the rounds'
    ratios (each round reads both), CPU seconds are per read, median, of the Spark JVM and of the server
    (``server_pid``, when it runs here). With ``cleanup`` both collections are dropped after.
    """
    from pymongo import MongoClient

    from bucketq_spark.reader import ReadOptions, explode_messages, read_buckets

    flat = f"{queue}_flat"
    payloads = _payloads(n_messages, payload_bytes)
    asyncio.run(_fill_queue(uri, db, queue, payloads, bucket_size, codec))
    _fill_flat(uri, db, flat, payloads)
    read = ReadOptions(partitions=partitions)
    parallelism = spark.sparkContext.defaultParallelism
    data_bytes = n_messages * payload_bytes  # the same payloads in both layouts
    with MongoClient(uri) as client:
        n_buckets = client[db][queue].count_documents({})
    spark_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    try:
        def buckets() -> DataFrame:
            return explode_messages(read_buckets(spark, uri, db, queue, expected_docs=n_buckets, read=read,
                                                 expected_bytes=data_bytes, codec=codec,
                                                 payload_schema=PAYLOAD_SCHEMA), PAYLOAD_SCHEMA)

        def naive() -> DataFrame:
            return (spark.read.format("mongodb").schema(FLAT_SCHEMA)
                    .option("connection.uri", uri).option("database", db).option("collection", flat)
                    .options(**read.reader_options(n_messages, parallelism, data_bytes)).load())

        layouts = {"bucketq": (buckets, n_buckets), "naive": (naive, n_messages)}
        _same_rows(buckets(), naive())  # untimed; also warms both paths up
        seconds: dict[str, list[float]] = {name: [] for name in layouts}
        cpu: dict[str, list[tuple[float | None, float | None]]] = {name: [] for name in layouts}
        expected = None
        for round_ in range(1 + max(1, repeats)):
            for name, (make, _) in layouts.items():
                cpu_before = process_cpu_s(spark_pid), process_cpu_s(server_pid)
                started = time.perf_counter()
                row = _summary(make()).collect()[0].asDict()
                elapsed = time.perf_counter() - started
                cpu_after = process_cpu_s(spark_pid), process_cpu_s(server_pid)
                if row["n"] != n_messages or (expected is not None and row != expected):
                    raise AssertionError(f"{name}: read {row}, expected {expected or n_messages} rows")
                expected = row
                if round_ > 0:  # round 0 warms up
                    seconds[name].append(elapsed)
                    cpu[name].append(tuple(None if b is None or a is None else a - b  # type: ignore[misc]
                                           for b, a in zip(cpu_before, cpu_after, strict=True)))
        out: dict[str, Any] = {"messages": n_messages, "payload_bytes": payload_bytes, "bucket_size": bucket_size,
                               "partitions": partitions, "rounds": len(seconds["naive"]), "codec": codec}
        for name, (_, docs) in layouts.items():
            best = min(seconds[name])
            spark_cpu = [c[0] for c in cpu[name] if c[0] is not None]
            server_cpu = [c[1] for c in cpu[name] if c[1] is not None]
            out[name] = {"docs": docs, "partitions": read.partition_count(docs, parallelism, data_bytes),
                         "rows": n_messages, "seconds": best, "rows_per_s": n_messages / best if best else 0.0,
                         "median_s": statistics.median(seconds[name]),
                         "spark_cpu_s": statistics.median(spark_cpu) if spark_cpu else None,
                         "server_cpu_s": statistics.median(server_cpu) if server_cpu else None,
                         "best_cpu_s": cpu[name][seconds[name].index(best)]}
        out["speedup"] = out["naive"]["seconds"] / out["bucketq"]["seconds"]
        out["median_speedup"] = statistics.median(n / b for b, n in zip(seconds["bucketq"], seconds["naive"],
                                                                          strict=True))
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
    return _time(server, SPARK_MESSAGES, payload_bytes=cfg.payloads[0])


def _time(server: Server, messages: int, **options: Any) -> dict:
    from bucketq_spark.session import build_session
    from devtools.jars import ensure_jars

    spark = build_session(ensure_jars("spark"))
    pid = server.embedded.pid if server.embedded is not None else None
    try:
        return time_read_paths(spark, server.uri, "bucketq_bench_spark", messages, server_pid=pid, **options)
    finally:
        spark.stop()


def rows(cfg: Settings, server: Server) -> list[dict]:
    missing = [name for name in ("pyspark", "bucketq_spark") if not _importable(name)]
    figures = None if missing else measure(cfg, server)
    out = []
    for contender in LAYOUTS:
        job = Job(contender, "spark_read", cfg.payloads[0], 1, SPARK_MESSAGES)
        if figures is None:
            out.append(skip_row(job, f"skipped: {' and '.join(missing)} not importable"))
            continue
        layout = LAYOUTS[contender] + (f" (codec {figures['codec']})" if contender == "bucketq" else "")
        row = skip_row(job, f"rows/s reading {layout} through the Spark connector (best of "
                            f"{figures['rounds']}; paired-round median bucketq/naive {figures['median_speedup']:.2f}x; "
                            "both layouts' decoded rows checked equal)")
        read = figures[contender]
        row["msgs_per_s"] = read["rows_per_s"]
        row["seconds"] = read["seconds"]
        row["documents"] = read["docs"]
        for field, cpu in zip(("cpu_s_per_1000", "server_cpu_s_per_1000"), read["best_cpu_s"], strict=True):
            row[field] = None if cpu is None else cpu * 1000.0 / read["rows"]  # the CPU of the read whose rate this is
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Spark read path only: bucket documents vs one document per message")
    parser.add_argument("--messages", type=int, default=SPARK_MESSAGES)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--bucket-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--codec", choices=("bson", "json"), default=CODEC, help="the bucket layout's payload codec")
    args = parser.parse_args(argv)
    with server() as srv:
        out = _time(srv, args.messages, payload_bytes=args.payload_bytes, bucket_size=args.bucket_size,
                    partitions=args.partitions, repeats=args.repeats, codec=args.codec)
        print(f"server: {srv.label}; bucket payloads: codec {args.codec}")
    for name in LAYOUTS:
        f = out[name]
        cpu = " ".join(f"{k} {f[k]:.2f} s" for k in ("spark_cpu_s", "server_cpu_s") if f[k] is not None)
        print(f"{name:8} {f['docs']:>7} docs in {f['partitions']} partition(s)  {f['rows']:>7} rows  "
              f"best {f['seconds']:7.3f} s (median {f['median_s']:.3f} s)  {f['rows_per_s']:>10,.0f} rows/s  "
              f"CPU per read: {cpu or 'n/a'}")
    print(f"speedup (bucketq / naive rows/s, best reads): {out['speedup']:.2f}x; "
          f"median of {out['rounds']} paired rounds: {out['median_speedup']:.2f}x (same decoded rows: checked)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

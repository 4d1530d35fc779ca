"""Spark read path: rows/s through the MongoDB Spark Connector from bucket documents vs one document per
message, both filled with the same messages (``bucketq_spark.readbench.time_read_paths``).
Skipped, with the reason, when ``pyspark`` or ``bucketq_spark`` does not import.

On its own, for the read path only (``make bench-quick``'s settings by default; both layouts in one run, since
the machine's load changes from minute to minute): ``python -m bench.spark_read [--messages 20000]
[--payload-bytes 1024] [--repeats 3] [--partitions N]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

from bench.plan import Job, Settings, skip_row
from bench.server import Server, server

LAYOUTS = {"bucketq": "bucket documents", "naive": "one document per message"}
SPARK_MESSAGES = 50_000


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that does not import
        return False


def measure(cfg: Settings, server: Server) -> dict:
    """Both layouts' rows/s from one Spark session: ``{"bucketq": {...}, "naive": {...}, "speedup"}``."""
    return _time(server.uri, min(cfg.messages, SPARK_MESSAGES), payload_bytes=cfg.payloads[0])


def _time(uri: str, messages: int, **options: object) -> dict:
    from bucketq_spark.readbench import time_read_paths
    from bucketq_spark.session import build_session

    spark = build_session()
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

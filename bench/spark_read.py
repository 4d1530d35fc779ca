"""Spark read path: rows/s through the MongoDB Spark Connector from bucket documents vs one document per
message, both filled with the same messages (``bucketq_spark.readbench.time_read_paths``).
Skipped, with the reason, when ``pyspark`` or ``bucketq_spark`` does not import.
"""

from __future__ import annotations

import importlib.util

from bench.plan import Job, Settings, skip_row
from bench.server import Server

LAYOUTS = {"bucketq": "bucket documents", "naive": "one document per message"}
SPARK_MESSAGES = 50_000


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that does not import
        return False


def measure(cfg: Settings, server: Server) -> dict:
    """Both layouts' rows/s from one Spark session: ``{"bucketq": {...}, "naive": {...}, "speedup"}``."""
    from bucketq_spark.readbench import time_read_paths
    from bucketq_spark.session import build_session

    spark = build_session()
    try:
        return time_read_paths(spark, server.uri, "bucketq_bench_spark", min(cfg.messages, SPARK_MESSAGES),
                               payload_bytes=cfg.payloads[0])
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

"""Spark read path: rows/s through the connector from bucket documents vs one document per message.

A hook: bucketq's Spark side is being built separately. ``rows()`` returns skipped rows with the reason
until both ``pyspark`` and ``bucketq_spark`` (spark/ in this repo) import and ``measure`` below is filled
in. To wire it: fill a queue (bucketq layout) and a one-document-per-message collection (naive layout) with the
bench's payloads, read each through the connector into a DataFrame, count the rows, and return
``rows / seconds`` per layout; the rows then flow into the table, the JSON and the goals like any other.
"""

from __future__ import annotations

import importlib.util

from bench.plan import Job, Settings, skip_row
from bench.server import Server

LAYOUTS = {"bucketq": "bucket documents", "naive": "one document per message"}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that does not import
        return False


def measure(layout: str, cfg: Settings, server: Server) -> float:
    """Rows per second read through the Spark connector from ``layout``. Not wired yet."""
    raise NotImplementedError("bench/spark_read.py: measure() is not wired to bucketq_spark yet")


def rows(cfg: Settings, server: Server) -> list[dict]:
    missing = [name for name in ("pyspark", "bucketq_spark") if not _importable(name)]
    out = []
    for contender in LAYOUTS:
        job = Job(contender, "spark_read", cfg.payloads[0], 1, cfg.messages)
        if missing:
            out.append(skip_row(job, f"skipped: {' and '.join(missing)} not importable"))
            continue
        try:
            row = skip_row(job, f"rows/s reading {LAYOUTS[contender]} through the Spark connector")
            row["msgs_per_s"] = measure(contender, cfg, server)
        except NotImplementedError as exc:
            row = skip_row(job, f"skipped: {exc}")
        out.append(row)
    return out

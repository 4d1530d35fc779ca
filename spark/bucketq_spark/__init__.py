"""Spark side of bucketq: a SparkSession with the MongoDB Spark connector (``spark.jars`` in local mode, or the
jars spark-submit was given), and the batch cycle (claim -> read -> process -> write -> commit) over a queue's
bucket documents.

Modules: ``session`` (``build_session``), ``reader`` (bucket documents -> one row per message), ``sinks``
(idempotent Parquet and MongoDB sinks), ``job`` (``BatchJob``). Only ``session`` is imported here: the others
import pyspark lazily too. The example job lives in ``spark/jobs``, the read benchmark in ``bench/spark_read.py``;
neither is part of this package.
"""

from bucketq_spark.session import (
    CONNECTOR_VERSION,
    MONGODB_DRIVER_VERSION,
    PAGINATE_INTO_PARTITIONS,
    PYSPARK_VERSION,
    SINGLE_PARTITION,
    ConnectorMissing,
    build_session,
    default_jars,
    executor_ids,
    expand_jars,
    require_connector,
    submitted,
)

__all__ = [
    "CONNECTOR_VERSION",
    "MONGODB_DRIVER_VERSION",
    "PAGINATE_INTO_PARTITIONS",
    "PYSPARK_VERSION",
    "SINGLE_PARTITION",
    "ConnectorMissing",
    "build_session",
    "default_jars",
    "executor_ids",
    "expand_jars",
    "require_connector",
    "submitted",
]

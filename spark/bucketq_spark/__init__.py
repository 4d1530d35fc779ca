"""Spark side of bucketq: a local SparkSession with the MongoDB Spark connector on ``spark.jars``."""

from bucketq_spark.session import (
    CONNECTOR_VERSION,
    MONGODB_DRIVER_VERSION,
    PAGINATE_INTO_PARTITIONS,
    PYSPARK_VERSION,
    SINGLE_PARTITION,
    build_session,
    default_jars,
)

__all__ = [
    "CONNECTOR_VERSION",
    "MONGODB_DRIVER_VERSION",
    "PAGINATE_INTO_PARTITIONS",
    "PYSPARK_VERSION",
    "SINGLE_PARTITION",
    "build_session",
    "default_jars",
]

"""A SparkSession with the MongoDB Spark connector, its jars given through ``spark.jars``.

The jars are a plain list of paths (never ``spark.jars.packages`` / Ivy): the connector
``mongo-spark-connector_2.13`` 10.5.0 and the MongoDB Java driver 5.1.4 (``mongodb-driver-sync``,
``mongodb-driver-core``, ``bson``, ``bson-record-codec``): ``build_session(jars=...)`` takes them (files or
directories), else ``default_jars()`` reads ``$BUCKETQ_SPARK_JARS``. This package never fetches them: in a
bucketq checkout ``make jars`` does (Maven, into ``.cache/jars/spark``), and the demo, tests and bench pass
that directory in.

Known to work: pyspark 4.0.1 (Scala 2.13, the pin) with Java 17. PyPI's pyspark 3.5.x bundles Scala 2.12 and
cannot load a ``_2.13`` connector.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bucketq.errors import BucketqError, InvalidOption

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PYSPARK_VERSION = "4.0.1"
CONNECTOR_VERSION = "10.5.0"
MONGODB_DRIVER_VERSION = "5.1.4"

# Read partitioners (option "partitioner"). The connector's default, SamplePartitioner, and the AutoBucket and
# PaginateBySize ones run $collStats, which mongo-java-server (the embedded test server) lacks.
_PARTITIONERS = "com.mongodb.spark.sql.connector.read.partitioner."
PAGINATE_INTO_PARTITIONS = _PARTITIONERS + "PaginateIntoPartitionsPartitioner"
SINGLE_PARTITION = _PARTITIONERS + "SinglePartitionPartitioner"

JARS_ENV = "BUCKETQ_SPARK_JARS"
LOCAL_MASTER = "local[2]"
_LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
# Set by spark-submit (and the pyspark shell) for the Python driver it starts: its JVM is already running, with the
# master and the classpath (``--jars``) spark-submit was given.
_GATEWAY_ENV = "PYSPARK_GATEWAY_PORT"


class ConnectorMissing(BucketqError, RuntimeError):
    """The MongoDB Spark connector is not on the Spark driver's classpath: nothing was claimed."""


def submitted() -> bool:
    """Whether this Python runs as the driver of a JVM that spark-submit (or a pyspark shell) started."""
    return _GATEWAY_ENV in os.environ


def require_connector(spark: SparkSession) -> None:
    """Raise ``ConnectorMissing`` unless the driver can load the ``mongodb`` data source: the check a read would
    make, done before a job claims or commits anything."""
    from py4j.protocol import Py4JJavaError

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "mongodb", spark._jsparkSession.sessionState().conf())
    except Py4JJavaError as exc:
        how = ("spark-submit puts jars on the driver only through --jars (or spark.jars given to spark-submit): "
               "spark-submit --jars <connector and driver jars, comma-separated> ..." if submitted() else
               "pass build_session(jars=[...]) or set $" + JARS_ENV)
        raise ConnectorMissing(
            f"the MongoDB Spark connector (mongo-spark-connector_2.13-{CONNECTOR_VERSION}.jar and mongodb-driver-sync, "
            f"mongodb-driver-core, bson and bson-record-codec {MONGODB_DRIVER_VERSION}) is not on the Spark driver's "
            f"classpath: {how}. ({str(exc.java_exception).splitlines()[0]})") from None


def expand_jars(items: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Jar paths from ``items``: a directory stands for the ``*.jar`` files in it (sorted), a file for itself."""
    jars: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        jars.extend(sorted(path.glob("*.jar")) if path.is_dir() else [path])
    return jars


def default_jars() -> list[Path]:
    """The connector's jars named by ``$BUCKETQ_SPARK_JARS``: jar files or directories of them, comma- or
    ``os.pathsep``-separated. Raises ``FileNotFoundError`` saying how to get them when it is unset or names no
    jar."""
    value = os.environ.get(JARS_ENV, "")
    jars = expand_jars([item.strip() for item in value.replace(",", os.pathsep).split(os.pathsep) if item.strip()])
    if not jars:
        where = f"${JARS_ENV}={value!r} names no jar" if value else f"${JARS_ENV} is not set"
        raise FileNotFoundError(
            f"no MongoDB Spark connector jars ({where}): pass build_session(jars=[<dir or jar>, ...]) or set "
            f"${JARS_ENV} to a directory holding mongo-spark-connector_2.13-{CONNECTOR_VERSION}.jar and "
            f"mongodb-driver-sync, mongodb-driver-core, bson and bson-record-codec {MONGODB_DRIVER_VERSION} "
            "(in a bucketq checkout: `make jars` fetches them into .cache/jars/spark)"
        )
    return jars


def executor_ids(spark: SparkSession) -> list[str]:
    """The ids of the executors the application has now: none in local mode, where the driver runs the tasks."""
    ids = spark.sparkContext._jsc.sc().getExecutorIds().mkString(",")
    return sorted(i for i in ids.split(",") if i)


def describe_executors(ids: Sequence[str]) -> str:
    """``executor_ids`` for a person: how many, then which (``"2 (ids 0, 1)"``), or ``"none (local mode)"``."""
    if not ids:
        return "none (local mode)"
    return f"{len(ids)} ({'id' if len(ids) == 1 else 'ids'} {', '.join(ids)})"


def build_session(
    jars: Sequence[str | os.PathLike[str]] | None = None,
    *,
    master: str | None = None,
    app_name: str = "bucketq",
    shuffle_partitions: int = 4,
    log_level: str = "WARN",
    timezone: str = "UTC",
    driver_memory: str | None = None,
    python: str = sys.executable,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or return the running, same-jars) SparkSession with the connector on ``spark.jars``, checked to load
    (``ConnectorMissing`` otherwise).

    ``jars``: jar files or directories of them (``expand_jars``); by default ``default_jars()``. ``master``: by
    default ``local[2]``. Python workers run ``python`` (this interpreter unless told).
    ``timezone`` is the SQL session time zone (BSON dates are UTC instants). ``conf`` is applied last.

    Under spark-submit (``submitted()``) the JVM runs already, with the master, the jars and the Python that
    spark-submit was given (``--master``, ``--jars``, ``PYSPARK_PYTHON``): they stand, and ``jars``, ``master``,
    ``python`` and ``driver_memory`` are refused (``InvalidOption``) rather than silently overriding them or
    coming too late for the driver's classpath; only the SQL settings and ``conf`` apply.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    sql = {"spark.sql.shuffle.partitions": str(shuffle_partitions), "spark.sql.session.timeZone": timezone}
    if submitted():
        given = [name for name, value in (("jars", jars), ("master", master), ("driver_memory", driver_memory))
                 if value is not None] + (["python"] if python != sys.executable else [])
        if given:
            raise InvalidOption(f"under spark-submit, give {', '.join(given)} to spark-submit (--jars, --master, "
                                "--driver-memory, PYSPARK_PYTHON), not to build_session: its JVM runs already")
        return _started(SparkSession.builder, {**sql, **(conf or {})}, log_level)

    master = master or LOCAL_MASTER
    paths = default_jars() if jars is None else expand_jars(jars)
    if not paths:
        raise FileNotFoundError(f"no jar in {[str(j) for j in jars or ()]} (in a bucketq checkout: `make jars`)")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"jar(s) not found: {', '.join(missing)}")
    spark_jars = ",".join(str(p.resolve()) for p in paths)

    running = SparkContext._active_spark_context
    if running is not None:
        # spark.jars only applies when the JVM starts: a running context without our jars is of no use.
        if running.getConf().get("spark.jars", "") != spark_jars:
            raise RuntimeError("a SparkContext with other spark.jars is running; stop it before build_session()")
        return SparkSession.builder.getOrCreate()

    os.environ["PYSPARK_PYTHON"] = python
    settings: dict[str, str] = {
        "spark.jars": spark_jars,
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **sql,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_LOG4J2.as_uri()}",
    }
    if master.startswith("local"):
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    if driver_memory:
        settings["spark.driver.memory"] = driver_memory
    for key, value in (conf or {}).items():
        if key == "spark.driver.extraJavaOptions":
            value = f"{settings[key]} {value}"
        settings[key] = str(value)
    return _started(SparkSession.builder.master(master).appName(app_name), settings, log_level)


def _started(builder: SparkSession.Builder, settings: Mapping[str, str], log_level: str) -> SparkSession:
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    require_connector(spark)
    return spark

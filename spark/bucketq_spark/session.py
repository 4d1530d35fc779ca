"""A SparkSession with the MongoDB Spark connector, its jars given through ``spark.jars``.

The jars are a plain list of paths (never ``spark.jars.packages`` / Ivy): the connector
``mongo-spark-connector_2.13`` 10.5.0 and the MongoDB Java driver 5.1.4 (``mongodb-driver-sync``,
``mongodb-driver-core``, ``bson``, ``bson-record-codec``). ``default_jars()`` finds them without the caller
knowing where they are: ``$BUCKETQ_SPARK_JARS`` first, then, in a bucketq checkout, the repo's Maven cache
(``.cache/jars/spark``, fetched by ``python -m devtools.jars spark`` from ``spark/jars/pom.xml``).

Known to work: pyspark 4.0.1 (Scala 2.13, the pin) with Java 17. PyPI's pyspark 3.5.x bundles Scala 2.12 and
cannot load a ``_2.13`` connector.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

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
_HERE = Path(__file__).resolve().parent
_LOG4J2 = _HERE / "log4j2.properties"


def _checkout_root() -> Path | None:
    """The bucketq checkout this file lives in (``<root>/spark/bucketq_spark``), if it is one."""
    root = _HERE.parent.parent
    if (root / "spark" / "jars" / "pom.xml").is_file() and (root / "devtools" / "jars.py").is_file():
        return root
    return None


def _jars_from_env(value: str) -> list[Path]:
    jars: list[Path] = []
    for item in value.replace(",", os.pathsep).split(os.pathsep):
        if not item.strip():
            continue
        path = Path(item.strip()).expanduser()
        jars.extend(sorted(path.glob("*.jar")) if path.is_dir() else [path])
    return jars


def default_jars() -> list[Path]:
    """The connector's jars: ``$BUCKETQ_SPARK_JARS`` (paths or directories, comma- or ``os.pathsep``-separated),
    else the bucketq checkout's cache, fetched with Maven first if ``devtools`` is importable and the pom changed."""
    env = os.environ.get(JARS_ENV)
    if env:
        return _jars_from_env(env)
    root = _checkout_root()
    if root is not None:
        try:
            from devtools import jars as devjars
        except ImportError:
            devjars = None
        if devjars is not None and Path(devjars.__file__).resolve().parent.parent == root:
            return devjars.ensure_jars("spark")
        cached = sorted((root / ".cache" / "jars" / "spark").glob("*.jar"))
        if cached:
            return cached
    raise FileNotFoundError(
        f"no MongoDB Spark connector jars: pass them to build_session(jars=...), set ${JARS_ENV}, "
        "or run `python -m devtools.jars spark` in a bucketq checkout"
    )


def build_session(
    jars: Sequence[str | os.PathLike[str]] | None = None,
    *,
    master: str = "local[2]",
    app_name: str = "bucketq",
    shuffle_partitions: int = 4,
    log_level: str = "WARN",
    timezone: str = "UTC",
    driver_memory: str | None = None,
    python: str = sys.executable,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or return the running, same-jars) SparkSession with the connector on ``spark.jars``.

    ``jars`` defaults to ``default_jars()``. Python workers run ``python`` (this interpreter unless told).
    ``timezone`` is the SQL session time zone (BSON dates are UTC instants). ``conf`` is applied last.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    paths = [Path(j) for j in (default_jars() if jars is None else jars)]
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
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": timezone,
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

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark

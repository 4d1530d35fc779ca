"""One SparkSession (local[2], the connector jars on spark.jars) for the whole test session, stopped at the end.

pyspark is imported lazily so that runs without the spark extra can still collect the other tests
(``-m "not spark"``); where the spark tests run, a missing pyspark fails them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SPARK_DIR = Path(__file__).resolve().parent.parent.parent / "spark"
if str(SPARK_DIR) not in sys.path:
    sys.path.insert(0, str(SPARK_DIR))  # bucketq_spark without an install, and the example jobs (spark/jobs)


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from bucketq_spark import build_session
    from devtools.jars import ensure_jars

    master = os.environ.get("BUCKETQ_SPARK_MASTER", "local[2]")
    session = build_session(ensure_jars("spark"), master=master, app_name="bucketq-tests")
    try:
        yield session
    finally:
        session.stop()

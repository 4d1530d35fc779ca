"""The Spark shells' entries that take a URI refuse a hostile one before Spark or the connector could echo it,
without its credentials (the table of tests/hostile_uris.py; no Spark session is started). An unreachable
server is ``ServerUnreachable`` where the Python side connects (``run_group_batch``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import bucketq
from tests.hostile_uris import CASES, UNREACHABLE, assert_hidden

pytestmark = pytest.mark.spark
NO_SESSION: Any = None  # the URI is checked before the session is used


def _entries() -> dict[str, Callable[[str], object]]:
    from pyspark.sql.types import StringType, StructField, StructType

    from bucketq_spark.job import BatchJob
    from bucketq_spark.reader import read_buckets, read_messages
    from bucketq_spark.sinks import MongoSink, ParquetSink
    from bucketq_spark.stream import read_stream_range, run_group_batch

    schema = StructType([StructField("a", StringType())])
    return {
        "BatchJob": lambda uri: BatchJob(NO_SESSION, uri, "db", "q", payload_schema=schema, process=lambda df: df,
                                         sink=ParquetSink("/nonexistent")),
        "read_buckets": lambda uri: read_buckets(NO_SESSION, uri, "db", "q"),
        "read_messages": lambda uri: read_messages(NO_SESSION, uri, "db", "q", schema),
        "read_stream_range": lambda uri: read_stream_range(NO_SESSION, uri, "db", "s", schema,
                                                           start=bucketq.Position(1), end=bucketq.Position(2)),
        "run_group_batch": lambda uri: run_group_batch(NO_SESSION, uri, "db", "s", "g", schema, lambda df: df,
                                                       ParquetSink("/nonexistent")),
        "MongoSink": lambda uri: MongoSink(uri, "db", "out"),
    }


ENTRIES = ["BatchJob", "read_buckets", "read_messages", "read_stream_range", "run_group_batch", "MongoSink"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("uri", "says"), CASES)
def test_spark_entries_hide_credentials_of_a_bad_uri(entry: str, uri: str, says: str, closed_port: int,
                                                     everything_logged: Callable[[], str]) -> None:
    with pytest.raises(bucketq.InvalidOption) as caught:
        _entries()[entry](uri.format(port=closed_port))
    assert str(caught.value).startswith("invalid MongoDB URI ") and says in str(caught.value)
    assert_hidden(str(caught.value), repr(caught.value), everything_logged())


async def test_a_failed_batch_stores_and_reports_its_error_redacted(monkeypatch: pytest.MonkeyPatch, mongo_uri: str,
                                                                  db_name: str, make_queue: Any, sync_db: Any) -> None:
    """A batch's error is stored in its buckets and shown: a URI in it (the connector's errors may quote one)
    loses its credentials."""
    from pyspark.sql.types import StringType, StructField, StructType

    from bucketq_spark.job import BatchJob
    from bucketq_spark.sinks import ParquetSink

    queue = make_queue()
    await queue.push({"a": "1"})
    await queue.close()
    schema = StructType([StructField("a", StringType())])
    monkeypatch.setattr("bucketq_spark.job.require_connector", lambda spark: None)  # no session: read is faked
    with BatchJob(NO_SESSION, mongo_uri, db_name, "events", payload_schema=schema, process=lambda df: df,
                  sink=ParquetSink("/nonexistent")) as job:
        def failing_read(batch: Any) -> Any:
            raise RuntimeError("connector: cannot read mongodb://alice9:S3cr/pw9@h1:1,h2:2/shop\n\tat java...")

        monkeypatch.setattr(job, "read", failing_read)
        result = job.run_once()
    assert result is not None and result.error == "RuntimeError: connector: cannot read mongodb://***@h1:1,h2:2/shop"
    assert_hidden(str(list(sync_db.events.find())))


def test_run_group_batch_says_an_unreachable_server(closed_port: int,
                                                    everything_logged: Callable[[], str]) -> None:
    with pytest.raises(bucketq.ServerUnreachable) as caught:
        _entries()["run_group_batch"](UNREACHABLE.format(port=closed_port))
    assert str(caught.value).startswith(f"cannot reach MongoDB at mongodb://***@127.0.0.1:{closed_port}/shop")
    assert_hidden(str(caught.value), everything_logged())

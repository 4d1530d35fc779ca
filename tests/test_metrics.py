"""Metrics over a real connection, read back through OpenTelemetry's SDK (an in-memory reader); the no-op
without OpenTelemetry; and counting that allocates nothing per call."""

from __future__ import annotations

import asyncio
import sys
import tracemalloc
from typing import Any

import pytest
from bson import ObjectId
from opentelemetry import metrics as otel
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import bucketq
from bucketq import metrics
from bucketq.core.held import FlushPlan, SlotState
from tests.helpers import utc_now


@pytest.fixture(scope="module")
def reader() -> InMemoryMetricReader:
    """The process's meter provider (OpenTelemetry allows one), read on demand. Instruments bucketq made on
    the API's proxy before it was set are forwarded to it."""
    reader = InMemoryMetricReader()
    otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def read(reader: InMemoryMetricReader, db: str) -> dict[str, float]:
    """Every bucketq instrument of database ``db``: a counter's value, a histogram's count and ``<name>.sum``."""
    values: dict[str, float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if point.attributes.get("bucketq.database") != db:
                        continue
                    assert point.attributes["bucketq.queue"] == "events"
                    if hasattr(point, "value"):
                        values[metric.name] = values.get(metric.name, 0) + point.value
                    else:
                        values[metric.name] = values.get(metric.name, 0) + point.count
                        values[metric.name + ".sum"] = values.get(metric.name + ".sum", 0) + point.sum
    return values


def counters(values: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("bucketq."): v for k, v in values.items() if k.removeprefix("bucketq.") in
            ("pushed", "buckets.written", "consumed", "acked", "nacked", "dead", "quarantined", "lease.lost")}


async def test_counters_and_push_latency_follow_the_queue(reader, make_queue, sync_db, db_name):
    producer = make_queue(bucket_max_wait=0.005)
    consumer = make_queue(state_flush_period=0.05)
    await producer.push_many([{"n": i} for i in range(10)])
    values = read(reader, db_name)
    assert counters(values) == {"pushed": 10, "buckets.written": 1, "consumed": 0, "acked": 0, "nacked": 0,
                                "dead": 0, "quarantined": 0, "lease.lost": 0}
    assert values["bucketq.push.latency"] == 1 and 0 <= values["bucketq.push.latency.sum"] < 30

    messages = [await consumer.reserve(timeout=2) for _ in range(5)]
    await messages[0].ack(wait=True)
    await messages[1].ack(wait=True)
    await messages[2].nack(60, error="later", wait=True)
    await messages[3].dead_letter(error="never", wait=True)
    now = utc_now()
    sync_db["events"].insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": now, "due": now, "n": 1,
                                  "p": ["{not json"], "done": [], "c": 0, "lease": None})
    await producer.purge()  # the consumer's bucket (5 messages unfinished) is gone under it...
    with pytest.raises(bucketq.LeaseLost):
        await messages[4].ack(wait=True)  # ...so its next flush is refused
    sync_db["events"].insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": now, "due": now, "n": 1,
                                  "p": ["{not json"], "done": [], "c": 0, "lease": None})
    assert await consumer.reserve(timeout=0.5) is None  # the malformed bucket goes to quarantine

    assert counters(read(reader, db_name)) == {"pushed": 10, "buckets.written": 1, "consumed": 5, "acked": 2,
                                               "nacked": 1, "dead": 1, "quarantined": 1, "lease.lost": 1}


async def test_totals_add_up_across_queue_objects_and_outlive_them(reader, make_queue, db_name):
    first = make_queue(bucket_max_wait=0.005)
    await first.push("one")
    await first.close()
    second = make_queue(bucket_max_wait=0.005)
    await second.push("two")
    assert counters(read(reader, db_name))["pushed"] == 2  # never goes down when a Queue is closed


async def test_pending_gauge_is_the_last_stats_count_of_messages_needing_a_worker(reader, make_queue, db_name):
    """The autoscaling signal counts messages (ready + in flight), not buckets; scheduled ones are left out."""
    q = make_queue(bucket_max_wait=0.005)
    await q.push_many(list(range(30)))  # one bucket
    await q.push_many(list(range(5)), delay=3600)
    assert "bucketq.pending" not in read(reader, db_name)  # nothing counted until stats() runs
    assert (await q.stats())["pending"] == 30
    assert read(reader, db_name)["bucketq.pending"] == 30
    held = await q.reserve(timeout=2)
    assert held is not None
    await held.ack(wait=True)
    assert (await q.stats())["pending"] == 29  # the 29 others of the held bucket, in flight
    assert read(reader, db_name)["bucketq.pending"] == 29


async def test_handler_duration_is_recorded_per_handler_call(reader, make_queue, db_name):
    q = make_queue(bucket_max_wait=0.005)
    await q.push_many(["a", "b", "c"])
    done = asyncio.Event()
    handled = []

    async def handler(message: bucketq.Message) -> None:
        await asyncio.sleep(0.05)
        handled.append(message.payload)
        if len(handled) == 3:
            done.set()

    worker = bucketq.Worker(q, handler, handle_signals=False)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 10)
    worker.stop()
    await task
    values = read(reader, db_name)
    assert values["bucketq.handler.duration"] == 3
    assert 0.15 <= values["bucketq.handler.duration.sum"] < 3
    assert counters(values)["acked"] == 3


async def test_without_opentelemetry_a_queue_records_nothing_and_works(monkeypatch, make_queue):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails as if it were not installed
    assert metrics._instruments.__wrapped__() is None
    monkeypatch.setattr(metrics, "_instruments", lambda: None)
    q = make_queue(bucket_max_wait=0.005)
    assert q._producer._metrics is metrics.NOOP and q._consumer._metrics is metrics.NOOP
    assert type(metrics.NOOP) is metrics.Metrics
    await q.push("works")
    message = await q.reserve(timeout=2)
    await message.ack(wait=True)
    assert message.payload == "works"


def _growth(call: Any, n: int = 20_000) -> int:
    """Bytes that ``n`` calls left allocated by bucketq's or OpenTelemetry's code. Only those files count: other
    threads (pytest-xdist's channel, an exporter) allocate at any time, which a whole-process reading would
    charge to the calls on a loaded machine."""
    own = [tracemalloc.Filter(True, "*/bucketq/*"), tracemalloc.Filter(True, "*/opentelemetry/*")]
    tracemalloc.start()
    try:
        call()  # first call outside the measure: lazy caches
        before = tracemalloc.take_snapshot().filter_traces(own)
        for _ in range(n):
            call()
        after = tracemalloc.take_snapshot().filter_traces(own)
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def test_counting_allocates_nothing_per_call(reader):
    otel_metrics = metrics.for_queue("events", "allocation-test")
    assert isinstance(otel_metrics, metrics.OtelMetrics)
    plan = FlushPlan(ObjectId(), "token", {0: SlotState.ACKED, 1: SlotState.RETRY})
    for recorder in (metrics.NOOP, otel_metrics):
        # 20,000 calls: a byte kept per call would show as 20,000. The bound leaves room for a dict resized.
        assert _growth(lambda r=recorder: r.consumed(1)) < 4096
        assert _growth(lambda r=recorder: r.flushed(plan, True)) < 4096
    totals = metrics._TOTALS["events", "allocation-test"]
    assert (totals.consumed, totals.acked, totals.nacked) == (20_001, 20_001, 20_001)  # each call counted

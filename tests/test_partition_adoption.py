"""Clients that do not name a partition count adopt the queue's (``partitions=None``, the default): the library's
clients, the ``BatchQueue``, the CLI's commands and the dashboard, on a queue created with 4 partitions; a client
that names another count is still refused."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import bucketq
from bucketq.batch import BatchQueue
from bucketq.cli import cli
from bucketq.core.sharding import LAYOUT
from bucketq.errors import InvalidOption
from bucketq.web import create_app
from tests.helpers import consume_all

pytestmark = pytest.mark.backends("memory", "server")
TOKEN = "adopt-token"


async def partitioned(make_queue: Any, messages: int = 12) -> None:
    """Queue ``events`` created with 4 partitions, ``messages`` buckets of one message each, ``{"i": i}``."""
    async with make_queue(partitions=4, bucket_max_size=1, bucket_max_wait=0.005) as creator:
        await creator.push_many([{"i": i} for i in range(messages)])


async def test_a_client_without_partitions_adopts_the_queues_and_serves_every_partition(make_queue, sync_db):
    await partitioned(make_queue, 0)
    q = make_queue(bucket_max_size=1, bucket_max_wait=0.005)
    await q.push_many([{"i": i} for i in range(12)])
    assert Counter(d["pt"] for d in sync_db.events.find()) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert (await q.stats())["ready"] == 12
    assert sorted(m.payload["i"] for m in await consume_all(q, want=12)) == list(range(12))
    assert (await q.stats())["ready"] == 0
    assert sync_db["events.control"].find_one(LAYOUT) == {"_id": "layout", "partitions": 4}


async def test_read_only_calls_before_set_up_read_the_layout_and_count_every_partition(make_queue, sync_db):
    await partitioned(make_queue)
    reader = make_queue()  # never set up: it writes nothing
    assert len(await reader.peek(100)) == 12
    assert (await reader.stats())["ready"] == 12 and await reader.paused() is False
    assert sorted(m.payload["i"] for m in await consume_all(reader, want=12)) == list(range(12))
    with pytest.raises(InvalidOption, match="the queue has 4 partitions, this client was opened with partitions=2"):
        await make_queue(partitions=2).peek()


async def test_a_new_queue_stores_one_partition_and_its_buckets_are_partition_0s(make_queue, sync_db):
    q = make_queue()
    assert await q.peek() == []  # a queue not created yet: read as one partition, nothing stored
    assert sync_db["events.control"].find_one(LAYOUT) is None
    await q.push("x")
    assert sync_db["events.control"].find_one(LAYOUT) == {"_id": "layout", "partitions": 1}
    assert [d["pt"] for d in sync_db.events.find()] == [0]
    with pytest.raises(InvalidOption, match="the queue has 1 partitions, this client was opened with partitions=4"):
        await make_queue(partitions=4).push("y")


async def test_the_layout_is_read_once_by_a_client_that_is_not_set_up(make_queue, memory_db):
    await partitioned(make_queue)
    reader = make_queue()
    memory_db.operations.clear()
    for _ in range(3):
        assert len(await reader.peek(100)) == 12
    layout_reads = [op for op in memory_db.operations.of("find", collection="events.control") if op.filter == LAYOUT]
    assert len(layout_reads) == 1


async def test_a_batch_queue_without_partitions_claims_from_every_partition(make_queue, sync_db):
    await partitioned(make_queue)
    with BatchQueue(sync_db, name="events") as batches:
        batch = batches.claim(100)
        assert batch is not None and batch.messages == 12
        assert Counter(doc["pt"] for doc in batch.buckets) == {0: 3, 1: 3, 2: 3, 3: 3}
        assert batches.commit(batch) == 12
    with BatchQueue(sync_db, name="events", partitions=1) as other, \
            pytest.raises(InvalidOption, match="the queue has 4 partitions, this client was opened with partitions=1"):
        other.claim(100)


async def test_cli_stats_peek_and_pause_work_on_a_partitioned_queue(make_queue, mongo_uri: str, db_name: str):
    await partitioned(make_queue)

    def bq(*args: str) -> str:
        result = CliRunner().invoke(cli, [*args, "--uri", mongo_uri, "--db", db_name])
        assert result.exit_code == 0, result.output
        return result.output

    assert json.loads(await asyncio.to_thread(bq, "stats", "events", "--json"))["ready"] == 12
    peeked = [json.loads(line) for line in (await asyncio.to_thread(bq, "peek", "events", "-n", "100", "--json"))
              .splitlines()]
    assert sorted(entry["payload"]["i"] for entry in peeked) == list(range(12))
    await asyncio.to_thread(bq, "pause", "events")
    assert await make_queue().paused() is True


def test_the_dashboard_counts_every_partition_and_its_actions_work(memory_db) -> None:
    with TestClient(create_app(memory_db, interval_s=3600, token=TOKEN, allow_actions=True)) as client:
        client.portal.call(_fill, memory_db)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/api/pending/events", headers=bearer).json()["ready"] == 12
        overview = client.get("/", headers=bearer).text
        row = re.search(r'<a href="[^"]*/queues/events">events</a>.*?</tr>', overview, re.DOTALL).group()  # type: ignore[union-attr]
        assert re.findall(r"<td>([\d,]+)</td>", row)[:3] == ["12", "12", "0"]  # pending, ready, scheduled
        done = client.post("/queues/events/pause", data={"confirm": "yes"}, headers=bearer)
        assert done.status_code == 200 and "paused queue" in done.text
        assert client.portal.call(_paused, memory_db) is True


async def _fill(db: Any) -> None:
    async with bucketq.Queue(db, name="events", partitions=4, bucket_max_size=1, bucket_max_wait=0.005) as q:
        await q.push_many([{"i": i} for i in range(12)])


async def _paused(db: Any) -> bool:
    async with bucketq.Queue(db, name="events") as q:
        return await q.paused()

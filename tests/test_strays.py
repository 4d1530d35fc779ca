"""Documents in a queue's collection that no claim can take (``core.strays``): an application's own document is
reported as not a bucket by ``stats()``, ``not_buckets()``, ``bucketq peek`` and the dashboard, and left as it is; a
broken bucket (one with the format's version field) goes to quarantine with the reason at a consumer's first
housekeeping round; neither is counted among the buckets and messages."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from bson import ObjectId
from click.testing import CliRunner
from starlette.testclient import TestClient

from bucketq.cli import cli
from bucketq.core import strays
from bucketq.memory.engine import matches
from bucketq.web import create_app
from tests.helpers import eventually, utc_now

pytestmark = pytest.mark.backends("memory", "server")

# An application's document in the queue's collection (the queue ``events`` in the application's ``events``)
FOREIGN = {"_id": 1, "status": "paid", "_outbox": []}
NOT_A_BUCKET = "not a bucket (no format version 'v'): due is missing"


def broken_bucket(**fields: Any) -> dict[str, Any]:
    """A one-message bucket, due 5 s ago, with ``fields`` changed."""
    past = utc_now() - dt.timedelta(seconds=5)
    return {"_id": ObjectId(), "v": 1, "enc": "json", "created": past, "due": past, "n": 1, "p": ['"lost"'],
            "done": [], "c": 0, "lease": None, "pt": 0, **fields}


async def test_an_applications_document_is_reported_as_not_a_bucket_and_left_alone(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.005)
    await q.push_many(["a", "b"])
    sync_db.events.insert_one(FOREIGN)
    stats = await q.stats()
    assert (stats["buckets"], stats["ready"], stats["not_buckets"]) == (1, 2, 1)
    assert [e.get("payload") for e in await q.peek()] == ["a", "b"]  # no "malformed bucket" entry
    assert await q.not_buckets() == {"count": 1, "documents": [{"id": 1, "reason": NOT_A_BUCKET}]}
    served = [await q.reserve(timeout=5), await q.reserve(timeout=5)]
    assert sorted(m.payload for m in served) == ["a", "b"]
    await asyncio.gather(*(m.ack() for m in served))
    await q._keep_house()  # the consumer's housekeeping round: it leaves the application's document where it is
    assert sync_db.events.find_one({"_id": 1}) == FOREIGN and await q.quarantined() == []


async def test_broken_buckets_no_claim_can_take_go_to_quarantine_with_the_reason(make_queue, sync_db):
    text_due, far_partition = broken_bucket(due="2026-01-01"), broken_bucket(pt=7)
    sync_db.events.insert_many([text_due, far_partition, broken_bucket(due=None), FOREIGN])
    q = make_queue(bucket_max_wait=0.005)
    await q.push("good")
    assert ((await q.stats())["ready"], (await q.stats())["not_buckets"]) == (1, 4)
    message = await q.reserve(timeout=5)  # its first claim starts housekeeping
    assert message is not None and message.payload == "good"
    await message.ack(wait=True)
    await eventually(lambda: sync_db["events.quarantine"].count_documents({}) == 3, what="3 buckets quarantined")
    reasons = {e["_id"]: e["reason"] for e in await q.quarantined()}
    assert reasons[text_due["_id"]] == "a bucket no claim can take: due is str '2026-01-01', not a date"
    assert reasons[far_partition["_id"]] == ("a bucket no claim can take: pt is int 7, not a partition of the "
                                             "queue (0 to 0)")
    kept = {e["_id"]: e["doc"] for e in await q.quarantined()}[text_due["_id"]]  # for an operator to mend, requeue
    assert (kept["due"], kept["p"]) == ("2026-01-01", ['"lost"'])
    assert [d["_id"] for d in sync_db.events.find({"fin": {"$exists": False}})] == [1]
    assert (await q.stats())["not_buckets"] == 1


async def test_peek_and_stats_on_the_command_line_and_the_dashboard_report_what_is_not_a_bucket(
        make_queue, sync_db, mongo_uri, db_name):
    await make_queue().push("a")
    sync_db.events.insert_many([FOREIGN, {"_id": 2, "status": "new"}])

    def bq(*args: str) -> str:
        result = CliRunner().invoke(cli, [*args, "--uri", mongo_uri, "--db", db_name], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return result.output

    shown = await asyncio.to_thread(bq, "peek", "events", "-n", "1")
    assert shown.splitlines()[-2:] == ["2 document(s) of 'events' no claim can take, the first ones:",
                                       f"  1: {NOT_A_BUCKET}"]
    lines = (await asyncio.to_thread(bq, "peek", "events", "--json")).splitlines()
    assert [json.loads(line) for line in lines][1:] == [{"not_a_bucket": i, "reason": NOT_A_BUCKET} for i in (1, 2)]
    table = " ".join((await asyncio.to_thread(bq, "stats", "events")).split())  # the caption wraps at the table's width
    assert "events: 2 document(s) no claim can take, not counted above (bucketq peek events lists them)" in table
    assert json.loads(await asyncio.to_thread(bq, "stats", "events", "--json"))["not_buckets"] == 2
    def queue_page() -> str:  # on a thread: the dashboard's queues are made outside this test's event loop
        with TestClient(create_app(mongo_uri, db=db_name)) as client:
            return client.get("/queues/events").text

    page = await asyncio.to_thread(queue_page)
    assert "not a bucket: 2" in page and "bucketq peek events" in page


def test_the_filters_and_the_reasons_agree():
    docs = [FOREIGN, broken_bucket(), broken_bucket(due="x"), broken_bucket(pt=3), broken_bucket(pt=None),
            broken_bucket(pt="0"), broken_bucket(pt=1.0)]
    for doc in docs:
        assert matches(doc, strays.strays(2)) == bool(strays.problems(doc, 2)), doc
        assert matches(doc, strays.claimable(2)) != matches(doc, strays.strays(2)), doc

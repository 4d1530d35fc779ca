"""``bucketq.testing``: in-memory queues for users' unit tests, and ``run`` that drives a handler inline and
reports each message's outcome."""

from __future__ import annotations

import pytest

import bucketq
import bucketq.testing
from bucketq.memory import MemoryDatabase

pytestmark = pytest.mark.memory


async def test_the_readme_example():
    async def checkout(order: dict, receipts: bucketq.Queue) -> None:
        await receipts.push({"order": order["id"], "email": order["email"]})

    sent = []

    async def send_receipt(message: bucketq.Message) -> None:
        sent.append(message.payload["email"])

    async with bucketq.testing.queue("receipts") as q:
        await checkout({"id": 1, "email": "a@example.com"}, receipts=q)
        report = await bucketq.testing.run(q, send_receipt)
    assert report.acked == [{"order": 1, "email": "a@example.com"}]
    assert not report.dead and sent == ["a@example.com"]


async def test_run_acks_what_the_handler_returns_from_and_retries_what_it_raises_until_dead():
    async with bucketq.testing.queue(max_attempts=3) as q:
        await q.push_many([{"n": 1}, {"n": 2}, {"n": 3}])

        def handler(message: bucketq.Message) -> None:  # a plain function works too
            if message.payload["n"] == 2:
                raise ValueError("bad amount")
            if message.payload["n"] == 3 and message.tries == 0:
                raise TimeoutError("flaky")

        report = await bucketq.testing.run(q, handler)
        assert report.acked == [{"n": 1}, {"n": 3}] and report.dead == [{"n": 2}] and report.nacked == []
        two = [(d.tries, d.outcome) for d in report.deliveries if d.payload == {"n": 2}]
        assert two == [(0, "nacked"), (1, "nacked"), (2, "dead")]
        assert [type(e).__name__ for e in report.errors] == ["ValueError", "TimeoutError", "ValueError",
                                                             "ValueError"]
        (dead,) = await q.dead_letters()
        assert dead["error"] == "ValueError: bad amount" and dead["tries"] == 3
        assert (await q.stats())["ready"] == 0


async def test_a_handler_may_resolve_its_own_message_and_later_retries_stay_queued():
    async with bucketq.testing.queue() as q:
        await q.push_many(["now", "later"])
        await q.push("scheduled", delay=60)

        async def handler(message: bucketq.Message) -> None:
            if message.payload == "later":
                await message.nack(delay=60)
            else:
                await message.ack()

        report = await bucketq.testing.run(q, handler)
        assert report.acked == ["now"] and report.nacked == ["later"]
        assert set(report.outcomes.values()) == {"acked", "nacked"}
        stats = await q.stats()
        assert (stats["ready"], stats["scheduled"]) == (0, 2)
        assert (await bucketq.testing.run(q, handler)).deliveries == []


async def test_run_stops_after_limit_deliveries():
    async with bucketq.testing.queue() as q:
        await q.push_many(range(5))
        report = await bucketq.testing.run(q, lambda m: None, limit=2)
        assert len(report.deliveries) == 2
        assert len((await bucketq.testing.run(q, lambda m: None)).acked) == 3
    with pytest.raises(bucketq.InvalidOption):
        await bucketq.testing.run(q, "not a handler")


async def test_queues_on_one_database_share_messages_and_options_are_checked():
    database = MemoryDatabase()
    async with bucketq.testing.queue("jobs", database=database) as producer, \
            bucketq.testing.queue("jobs", database=database, dedupe=True) as consumer:
        await producer.push("x", key="k")
        await producer.push("x", key="k")
        report = await bucketq.testing.run(consumer, lambda m: None)
        assert report.acked == ["x"], "dedupe works in test mode as on MongoDB"
        assert consumer.options.bucket_max_wait == bucketq.testing.TEST_DEFAULTS["bucket_max_wait"]
        assert [op.command for op in database.operations.of("insert", collection="jobs")] == ["insert", "insert"]
    with pytest.raises(bucketq.InvalidOption, match="lease"):
        bucketq.testing.queue(lease=-1)


async def test_faults_can_be_injected_into_a_test_queue():
    async with bucketq.testing.queue() as q:
        lost = q.database.faults.lose_reply("insert")
        await q.push("once")  # stored, reply lost, retried: a duplicate, counted as stored
        assert lost.hits == 1
        assert (await bucketq.testing.run(q, lambda m: None)).acked == ["once"]

"""``SyncProducer``: pushes from code without an event loop, with the async producer's buffering, durability and
errors, over the generated synchronous store."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import bucketq
from tests.helpers import drained
from tests.proxy import TcpProxy

pytestmark = pytest.mark.backends("memory", "server")


@pytest.fixture
def producer_target(backend: str, request: pytest.FixtureRequest) -> Any:
    """What a ``SyncProducer`` on the test's database is given: the in-memory database, or the server's URI."""
    return request.getfixturevalue("memory_db" if backend == "memory" else "mongo_uri")


@pytest.fixture
def make_producer(producer_target: Any, db_name: str, sync_db) -> Iterator:
    """``make_producer(target=None, **options)``: SyncProducers of queue "events" on the test's database, closed
    after."""
    made: list[bucketq.SyncProducer] = []

    def make(target: Any = None, **options: Any) -> bucketq.SyncProducer:
        producer = bucketq.SyncProducer(target or producer_target, name="events", db=db_name, **options)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close()


def _stored(sync_db) -> list[Any]:
    """Every payload stored in queue "events", decoded, in bucket order."""
    return [json.loads(p) for doc in sync_db.events.find() if "p" in doc for p in doc["p"]]


@pytest.mark.real_time  # threads push: the loop cannot foresee their writes
async def test_sync_pushes_from_threads_are_consumed_by_an_async_queue(make_producer, make_queue, sync_db):
    producer = make_producer(bucket_max_wait=0.05)
    n_threads, each = 8, 50

    def pusher(t: int) -> list[str]:
        return [producer.push({"t": t, "i": i}) for i in range(each)]

    ids_by_thread = await asyncio.gather(*(asyncio.to_thread(pusher, t) for t in range(n_threads)))
    ids = [i for ids in ids_by_thread for i in ids]
    assert len(set(ids)) == n_threads * each
    assert sync_db.events.count_documents({}) < n_threads * each, "pushes from many threads shared buckets"
    many = await asyncio.to_thread(producer.push_many, [{"many": i} for i in range(5)])
    consumed = {m.id: m.payload for m in await drained(make_queue(), want=len(ids) + len(many))}
    assert consumed == {**{i: {"t": t, "i": n} for t, ids in enumerate(ids_by_thread) for n, i in enumerate(ids)},
                        **{i: {"many": n} for n, i in enumerate(many)}}


def test_a_push_returns_once_its_bucket_is_stored(make_producer, sync_db):
    producer = make_producer(bucket_max_wait=30)  # a lone push goes at once (group commit), not after 30 s
    message_id = producer.push({"hello": "world"}, headers={"h": 1}, key="k1", priority=3)
    bucket_id, slot = message_id.rsplit(":", 1)
    (doc,) = sync_db.events.find()
    assert str(doc["_id"]) == bucket_id and json.loads(doc["p"][int(slot)]) == {"hello": "world"}
    assert doc["pr"] == 3


@pytest.mark.backends("server")  # the in-memory database's sync view takes no faults: the proxy loses the reply
def test_a_push_whose_insert_lost_its_reply_stores_its_message_once(make_producer, request, sync_db):
    """The insert is applied and its reply lost: the retry, under the bucket's own ``_id``, stores nothing twice
    and the push returns the id of the message stored."""
    proxy = TcpProxy.to(request.getfixturevalue("mongo_uri")).start()
    request.addfinalizer(proxy.stop)
    producer = make_producer(target=proxy.uri, bucket_max_size=100)
    producer.push("warm")  # set up first: the fault is for a bucket's insert
    lost = proxy.lose_reply("insert", collection="events")
    ids = producer.push_many([{"i": i} for i in range(250)])
    one = producer.push("one")
    assert lost.hits == 1
    producer.close()
    assert sorted(_stored(sync_db), key=str) == sorted(["warm", "one", *({"i": i} for i in range(250))], key=str)
    by_id = {str(d["_id"]): d["p"] for d in sync_db.events.find()}
    assert [json.loads(by_id[i.rsplit(":", 1)[0]][int(i.rsplit(":", 1)[1])]) for i in ids] == [
        {"i": i} for i in range(250)]
    assert json.loads(by_id[one.rsplit(":", 1)[0]][int(one.rsplit(":", 1)[1])]) == "one"


@pytest.mark.backends("server")
@pytest.mark.timeout(120)
def test_connection_cuts_mid_run_lose_and_duplicate_nothing(mongo_uri, make_producer, sync_db):
    with TcpProxy.to(mongo_uri) as proxy:
        producer = make_producer(target=proxy.uri, bucket_max_size=100, bucket_max_wait=0.05)
        total, n_threads = 4000, 8
        ids: list[str] = []
        done = threading.Event()

        def pusher(t: int) -> None:
            for i in range(t, total, n_threads):
                ids.append(producer.push({"i": i}))

        threads = [threading.Thread(target=pusher, args=(t,)) for t in range(n_threads)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads) and proxy.cuts < 8:
            done.wait(0.15)
            proxy.cut()
        for thread in threads:
            thread.join(60)
        producer.close()
    assert proxy.cuts >= 8
    assert len(set(ids)) == total
    assert sorted(p["i"] for p in _stored(sync_db)) == list(range(total)), "a message was lost or stored twice"


@pytest.mark.backends("server")
def test_a_write_that_keeps_failing_fails_its_push(db_name, closed_port, make_producer):
    producer = make_producer(target=f"mongodb://127.0.0.1:{closed_port}/?serverSelectionTimeoutMS=100"
                                    "&connectTimeoutMS=100", write_timeout=0.3)
    producer._clock._synced_at = 1e18  # skip the set-up, which would fail first with the same error
    producer._indexed = True
    with pytest.raises(bucketq.WriteFailed):
        producer.push({"x": 1})


def test_an_unreachable_server_fails_the_push_with_server_unreachable(db_name, closed_port, make_producer):
    producer = make_producer(target=f"mongodb://127.0.0.1:{closed_port}/?serverSelectionTimeoutMS=100"
                                    "&connectTimeoutMS=100", write_timeout=0.3)
    with pytest.raises(bucketq.ServerUnreachable):
        producer.push({"x": 1})


def test_bad_payloads_and_arguments_fail_their_own_push(make_producer, sync_db):
    producer = make_producer(bucket_max_bytes=4096)
    with pytest.raises(bucketq.EncodeError):
        producer.push({1, 2})
    with pytest.raises(bucketq.PayloadTooLarge):
        producer.push("x" * 5000)
    with pytest.raises(bucketq.InvalidOption, match="delay"):
        producer.push(1, delay=-1)
    with pytest.raises(bucketq.EncodeError, match="payload 1"):
        producer.push_many([1, {1, 2}, 3])
    assert producer.push("fine")
    assert _stored(sync_db) == ["fine"], "a bad push_many pushed nothing"


def test_push_after_close_is_refused_and_close_writes_what_is_buffered(make_producer, sync_db):
    with make_producer() as producer:
        producer.push(1)
    with pytest.raises(bucketq.QueueClosed):
        producer.push(2)
    producer.close()  # idempotent
    assert _stored(sync_db) == [1]


@pytest.mark.parametrize("options, message", [
    ({"bucket_max_size": 0}, "bucket_max_size"),
    ({"max_buffered_bytes": 10}, "max_buffered_bytes"),
    ({"write_concern": 0}, "write_concern"),
    ({"lease": 3, "state_flush_period": 2}, "state_flush_period"),
    ({"colour": "blue"}, "unknown option"),
    ({"codec": "xml"}, "unknown codec"),
    ({"name": "a$b"}, "not a valid queue name"),
])
def test_invalid_options_fail_at_construction(producer_target, options, message):
    kwargs = {"name": "events", **options}
    with pytest.raises(bucketq.InvalidOption, match=message):
        bucketq.SyncProducer(producer_target, **kwargs)


def test_bad_target_fails_at_construction():
    with pytest.raises(bucketq.InvalidOption, match="invalid MongoDB URI"):
        bucketq.SyncProducer("http://nowhere", name="events")
    with pytest.raises(bucketq.InvalidOption, match="SyncProducer needs a URI"):
        bucketq.SyncProducer(42, name="events")  # type: ignore[arg-type]


def test_a_unique_job_pushed_again_is_merged_into_the_pending_one(make_producer, sync_db):
    producer = make_producer()
    first = producer.push({"report": 1}, key="report-1", unique_for=60)
    again = producer.push({"report": 1, "again": True}, key="report-1", unique_for=60)
    other = producer.push({"report": 2}, key="report-2", unique_for=60)
    assert again == first and other != first
    assert _stored(sync_db) == [{"report": 1}, {"report": 2}], "the bucket of the merged push is not written"
    assert {doc["_id"] for doc in sync_db["events.unique"].find()} == {"report-1", "report-2"}
    with pytest.raises(bucketq.InvalidOption, match="unique_for needs a key"):
        producer.push(1, unique_for=60)

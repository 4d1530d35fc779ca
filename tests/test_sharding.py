"""Partitions (``partitions=N``, bucketq/core/sharding.py, docs/SCALING.md): the routing functions, where
buckets go and how consumers move across partitions, over a real connection; and the shard-key audit
(tests/shardkeys.py) over every queue operation with ``partitions=4``: every command on the buckets collection
names the shard key, and only operators' admin commands scan."""

from __future__ import annotations

import datetime as dt
import zlib
from collections import Counter
from itertools import pairwise

import pytest
from bson import ObjectId
from pymongo import AsyncMongoClient, MongoClient

import bucketq
from bucketq import Outgoing
from bucketq.batch import BatchQueue
from bucketq.core import sharding
from bucketq.core.backoff import Backoff
from bucketq.core.sharding import Rotation, Spread, assign_by_id, partition_of
from bucketq.errors import InvalidOption
from bucketq.outbox import Outbox, event
from tests.helpers import consume_all, next_message
from tests.shardkeys import ShardKeyAudit


def test_partition_of_a_group_is_crc32_of_its_utf8_mod_partitions() -> None:
    assert partition_of("order-17", 3) == 1525286420 % 3 == 2  # the example of docs/FORMAT.md
    assert partition_of("ünïcode", 7) == zlib.crc32("ünïcode".encode()) % 7
    assert {partition_of("g", 1), partition_of("order-17", 1)} == {0}


def test_spread_goes_round_robin_and_keeps_groups_and_copies_in_their_partition() -> None:
    spread = Spread()
    docs = [{"_id": i} for i in range(8)] + [{"_id": 8, "g": "order-17"}, {"_id": 9, "pt": 3}]
    spread.assign(docs, 4)
    plain = [d["pt"] for d in docs[:8]]
    assert Counter(plain) == {0: 2, 1: 2, 2: 2, 3: 2} and all((b - a) % 4 == 1 for a, b in pairwise(plain))
    assert docs[8]["pt"] == partition_of("order-17", 4) and docs[9]["pt"] == 3


def test_assign_by_id_gives_every_writer_the_same_partitions_and_keeps_groups_and_copies_in_theirs() -> None:
    def docs() -> list[dict]:
        return [{"_id": f"event-{i}"} for i in range(8)] + [{"_id": 8, "g": "order-17"}, {"_id": 9, "pt": 3}]
    first, second = docs(), docs()
    assign_by_id(first, 4)
    assign_by_id(second, 4)  # another process writing the same buckets
    assert first == second
    assert [d["pt"] for d in first[:8]] == [partition_of(f"event-{i}", 4) for i in range(8)]
    assert first[8]["pt"] == partition_of("order-17", 4) and first[9]["pt"] == 3


def test_rotation_tries_each_partition_once_a_round_and_moves_on_after_a_claim() -> None:
    rotation = Rotation()
    first = list(rotation.round(5))
    assert sorted(first) == [0, 1, 2, 3, 4]
    rotation.claimed(first[0])  # a busy partition: the next claim starts after it, whatever it holds
    assert list(rotation.round(5))[0] == (first[0] + 1) % 5
    served = Counter()
    for _ in range(20):  # every claim succeeds in the first partition tried: each gets its turn
        p = next(rotation.round(5))
        served[p] += 1
        rotation.claimed(p)
    assert served == {p: 4 for p in range(5)}


@pytest.mark.parametrize("value", [0, 1025, True, 2.0, "2"])
def test_partitions_is_validated(value) -> None:
    with pytest.raises(InvalidOption, match="partitions"):
        bucketq.QueueOptions(partitions=value)
    with pytest.raises(InvalidOption, match="partitions"):
        BatchQueue(MongoClient("mongodb://127.0.0.1:1", connect=False), name="q", partitions=value)


def test_shard_commands_shard_the_buckets_and_zone_each_range_of_partitions() -> None:
    lines = sharding.shard_commands("app", "events", 4, shards=2)
    assert lines[:2] == ['db.getSiblingDB("app").getCollection("events").createIndex({pt: 1, _id: 1})',
                         'sh.shardCollection("app.events", {pt: 1, _id: 1})']
    ranges = [line for line in lines if line.startswith("sh.updateZoneKeyRange")]
    assert ranges == [
        'sh.updateZoneKeyRange("app.events", {pt: MinKey, _id: MinKey}, {pt: 2, _id: MinKey}, "app.events-z0")',
        'sh.updateZoneKeyRange("app.events", {pt: 2, _id: MinKey}, {pt: MaxKey, _id: MaxKey}, "app.events-z1")']
    assert len([line for line in sharding.shard_commands("app", "events", 3) if "ZoneKeyRange" in line]) == 3


pytestmark_backends = pytest.mark.backends("memory", "server")


@pytestmark_backends
async def test_buckets_spread_over_partitions_and_every_message_is_served(make_queue, sync_db):
    q = make_queue(partitions=4, bucket_max_size=1, bucket_max_wait=0.01)
    await q.push_many([{"i": i} for i in range(12)] + [Outgoing({"g": i}, group="order-17") for i in range(4)])
    docs = list(sync_db.events.find())
    plain = Counter(d["pt"] for d in docs if "g" not in d)
    assert plain == {0: 3, 1: 3, 2: 3, 3: 3}
    assert {d["pt"] for d in docs if "g" in d} == {partition_of("order-17", 4)}
    got = await consume_all(q, want=16)
    assert sorted(m.payload["i"] for m in got if "i" in m.payload) == list(range(12))
    assert [m.payload["g"] for m in got if "g" in m.payload] == [0, 1, 2, 3]
    assert all(d["pt"] in range(4) for d in sync_db.events.find())  # tombstones keep theirs


@pytestmark_backends
async def test_clients_of_one_queue_with_different_partition_counts_are_refused_naming_both(make_queue, sync_db):
    await make_queue(partitions=4).push("x")
    assert sync_db["events.control"].find_one({"_id": "layout"}) == {"_id": "layout", "partitions": 4}
    for other in (1, 8):
        with pytest.raises(InvalidOption, match=f"the queue has 4 partitions, this client was opened with "
                                                f"partitions={other}"):
            await make_queue(partitions=other).push("y")
    same = make_queue(partitions=4)
    await same.push("z")
    assert sorted([m.payload for m in await consume_all(same, want=2)]) == ["x", "z"]


@pytestmark_backends
async def test_a_bucket_without_pt_is_served_in_partition_0(make_queue, sync_db):
    """A bucket written before partitions (or by a writer that does not set pt): served, its retry copy written
    to partition 0 with its pt, its tombstone marked pt: null."""
    q = make_queue(partitions=4, max_attempts=2, retry_base=0)
    await q.push("warm-up")  # the queue is set up: the old bucket comes after, as from an old writer
    now = dt.datetime.now(dt.timezone.utc)
    old = ObjectId()
    sync_db.events.insert_one({"_id": old, "v": 1, "enc": "json", "created": now, "due": now, "n": 2,
                               "p": ['"a"', '"b"'], "done": [], "c": 0, "lease": None})
    seen = []
    for _ in range(4):  # warm-up, a, b and b's retry
        m = await next_message(q)
        seen.append(m.payload)
        if m.payload == "b" and m.tries == 0:
            await m.nack(delay=0)
        else:
            await m.ack()
    await q.drain()
    assert sorted(seen) == ["a", "b", "b", "warm-up"]
    assert sync_db.events.find_one({"_id": old})["pt"] is None and "fin" in sync_db.events.find_one({"_id": old})
    others = list(sync_db.events.find({"_id": {"$ne": old}}))  # the warm-up's and the retry copy's tombstones
    assert len(others) == 2 and {d["pt"] for d in others} <= {0, 1, 2, 3} and 0 in {d["pt"] for d in others[1:]}


@pytest.mark.server
async def test_every_command_on_the_buckets_names_the_shard_key(mongo_uri, db_name, sync_db):
    """push, push_many, consume with acks, a nack (retry bucket), dead letters and their requeue, an ordered
    group (lock, wait, hand-off), the outbox relay, a schedule's tick, peek, stats, remove, purge, purge_expired,
    and the BatchQueue's claim, commit and release: no command on the buckets lacks ``pt``, and only the admin
    commands (stats, remove's copy lookup, purge) and the housekeeping's look for strays scan."""
    audit = ShardKeyAudit(db_name, sharding.audit_keys("events"))
    client = AsyncMongoClient(mongo_uri, event_listeners=[audit])
    sync = MongoClient(mongo_uri, event_listeners=[audit])
    try:
        q = bucketq.Queue(client, name="events", db=db_name, partitions=4, bucket_max_size=3,
                          bucket_max_wait=0.01, max_attempts=2, retry_base=0, lease=5, state_flush_period=0.05)
        await q.push({"n": 0})
        await q.push_many([{"n": i} for i in range(1, 10)])
        await q.push_many([Outgoing({"g": "order-17", "i": i}, group="order-17") for i in range(5)]
                          + [Outgoing({"g": "order-18", "i": i}, group="order-18") for i in range(3)])
        served = []
        for _ in range(10 + 1 + 8):  # the ten, the retry of one, the groups' eight
            message = await next_message(q)
            served.append(message.payload)
            if message.payload == {"n": 3}:
                await message.nack(delay=0, wait=True)  # a retry bucket, then a dead letter
            else:
                await message.ack()
        assert sorted(p["n"] for p in served if "n" in p) == sorted([*range(10), 3])
        for group, n in (("order-17", 5), ("order-18", 3)):
            assert [p["i"] for p in served if p.get("g") == group] == list(range(n))
        assert len(await q.dead_letters()) == 1
        assert await q.requeue_dead() == 1
        await client[db_name].orders.insert_one({"_id": "x", "_outbox": [event({"o": 1}), event({"o": 2})]})
        assert await Outbox(client[db_name].orders, q).run_once() == 2
        schedule = bucketq.Schedule(q, "* * * * *", {"s": 1}, name="audit")
        start = dt.datetime(2026, 1, 5, 9, 0, 30, tzinfo=dt.timezone.utc)
        await schedule.run_once(now=start)
        assert len(await schedule.run_once(now=start + dt.timedelta(minutes=1))) == 1
        assert len(await consume_all(q, want=4)) == 4  # the requeued letter, the two events and the tick
        await q.close()
        q = bucketq.Queue(client, name="events", db=db_name, partitions=4, lease=5)
        # the only look of a consumer's that pins no partition: its housekeeping's, for documents no claim can take
        # (``core.strays``: partly outside every partition), at most once per ``shell.strays.SWEEP_EVERY_S``
        assert set(audit.scans) <= {"find on events"}, "no scan outside the admin commands and housekeeping"
        audit.scans.clear()
        await q.peek(5)
        with BatchQueue(sync, name="events", db=db_name, partitions=4, lease=5, backoff=Backoff(0, 1, 0, 0)) as bq:
            await q.push_many([{"b": i} for i in range(6)])
            await q.flush()
            first = bq.claim(10)
            assert first is not None and bq.release(first, "boom")["released"]
            second = bq.claim(10)
            assert second is not None
            bq.extend(second)
            assert bq.commit(second) == len(second.buckets)
        ids = [await q.push({"r": i}) for i in range(3)]
        assert await q.remove(ids[0]) is True
        admin_only = set(audit.scans)
        await q.stats()
        assert await q.purge() == 2
        await q.purge_expired()
        await q.close()
        assert audit.untargeted == [], "\n".join(audit.untargeted)
        assert set(audit.scans) - admin_only <= {"aggregate on events", "update on events", "find on events"}
        assert admin_only <= {"find on events"}  # remove()'s lookup of a message's copies
        assert {"findAndModify on events", "insert on events", "update on events"} <= set(audit.targeted)
    finally:
        await client.close()
        sync.close()

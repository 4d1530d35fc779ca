"""The shard-key audit over a partitioned stream's commands: push, read, ack, commit, the hole
rule's gap marker, reset (to the beginning, a time, a position), retention, stats and the Spark range take run
through a client whose ``CommandListener`` (tests/shardkeys.py) names any command on ``S``, the collection to be
sharded (``core.STREAM_SHARD_KEYS``), whose filter does not pin ``pt``. The side collections are not sharded."""

from __future__ import annotations

import asyncio
import datetime as dt

from pymongo import AsyncMongoClient, MongoClient

import bucketq
from bucketq.core.stream_format import STREAM_SHARD_KEYS
from bucketq_spark.stream import commit_range, uncommitted_ranges
from tests.helpers import read_all
from tests.shardkeys import ShardKeyAudit


def _keys(name: str) -> dict[str, str]:
    return {name + suffix: next(iter(key)) for suffix, key in STREAM_SHARD_KEYS.items()}


async def test_every_command_of_a_partitioned_stream_on_its_buckets_pins_the_partition(mongo_uri, db_name) -> None:
    audit = ShardKeyAudit(db_name, _keys("ev"))
    assert audit.keys == {"ev": "pt"}
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri, event_listeners=[audit])
    try:
        stream = bucketq.Stream(client, name="ev", db=db_name, partitions=3, bucket_max_size=2, gap_wait=0.2,
                                poll_interval=0.01, state_flush_period=0.05, retention_messages=4)
        async with stream:
            before = stream.clock.now() - dt.timedelta(seconds=1)
            for i in range(0, 12, 2):
                await stream.push_many([i, i + 1])
            await client[db_name]["ev.seq"].update_one({"_id": "seq.0"}, {"$inc": {"last": 1}})  # a hole
            await stream.push_many([12, 13])
            async with stream.reader("g", start="beginning") as reader:
                await read_all(reader, timeout=0.5, n=10)
                await asyncio.sleep(0.3)
                await reader.read_many(10, timeout=0.3)  # marks the hole a gap and commits past it
            assert await client[db_name]["ev"].count_documents({"gap": True, "pt": 0}) == 1
            await stream.reset("g", at=before)
            await stream.reset("g", bucketq.Position(2, 0, 1))
            await stream.reset("g", "beginning")
            await stream.apply_retention()
            await stream.stats()
    finally:
        await client.close()
    sync: MongoClient = MongoClient(mongo_uri, event_listeners=[audit])
    try:
        taken = uncommitted_ranges(sync[db_name], "ev", "spark")
        assert all(commit_range(sync[db_name], "ev", r) for r in taken if not r.empty)
    finally:
        sync.close()
    assert audit.untargeted == []
    for command in ("insert on ev", "find on ev", "delete on ev"):
        assert audit.targeted[command] > 0, command
    assert audit.scans == {"aggregate on ev": 1}  # stats()' count of the buckets: an operator's read through

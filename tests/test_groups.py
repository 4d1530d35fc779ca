"""Ordered groups (``push(group=...)``) over a real connection: push order within and across buckets, one
message of a group at a time, nacks that hold back their group only, tries per slot, yield and hand-off,
concurrent producers, lost replies on the lock, and a consumer killed while holding a group."""

from __future__ import annotations

import asyncio

import pytest

import bucketq
from bucketq import Outgoing

pytestmark = pytest.mark.backends("memory", "server")


async def handle_all(q: bucketq.Queue, *, timeout: float = 1.0) -> list[bucketq.Message]:
    got = []
    while (message := await q.reserve(timeout=timeout)) is not None:
        got.append(message)
        await message.ack()
    return got


async def test_a_group_is_delivered_in_push_order_across_buckets(make_queue, sync_db):
    q = make_queue(bucket_max_size=3, bucket_max_wait=0.01)
    await q.push_many([Outgoing({"i": i}, group="g1") for i in range(10)] + [{"plain": 1}])
    docs = list(sync_db.events.find({"g": "g1"}).sort("_id", 1))
    assert [len(d["p"]) for d in docs] == [3, 3, 3, 1] and all(d["v"] == 2 and d["t"] == [0] * d["n"] for d in docs)
    got = await handle_all(q, timeout=0.5)
    assert [m.payload["i"] for m in got if "i" in m.payload] == list(range(10))

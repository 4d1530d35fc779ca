"""The floor: what the server and the codec allow at best, with no queue logic at all.

push: bucket documents (``bucket_max_size`` orjson-encoded messages each), built and BSON-encoded before
the clock starts, inserted by insert_many calls of ``window`` messages (the other contenders' limit of
un-acknowledged pushes). consume: find_one_and_delete per bucket plus orjson decoding of its messages.
latency: the round trip of one insert, sequential insert_one calls of pre-encoded one-message buckets
through the async driver bucketq uses. encode / decode: orjson alone on the payloads, no server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import bson
import orjson
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, MongoClient
from pymongo.collection import Collection

from bench.worker import Ctx, main, payload, split, write_concern

CODEC_POOL = 1024


def _open(ctx: Ctx) -> tuple[MongoClient, Collection]:
    s = ctx.spec
    client: MongoClient = MongoClient(s["uri"], event_listeners=[ctx.commands], w=write_concern(s))
    return client, client[s["db"]][s["queue"]]


def _buckets(ctx: Ctx, size: int) -> list[tuple[RawBSONDocument, int]]:
    """The spec's messages as buckets of at most ``size`` messages, BSON-encoded, each with its count."""
    total = ctx.spec["messages"]
    now = dt.datetime.now(dt.timezone.utc)
    docs = []
    for n in split(total, -(-total // size) or 1):
        msgs = [orjson.dumps(payload(i, ctx.pad)) for i in range(n)]
        docs.append((RawBSONDocument(bson.encode({"_id": bson.ObjectId(), "mature": now, "n": n, "b": msgs})), n))
    return docs


def push(ctx: Ctx) -> None:
    """The buckets in insert_many calls of ``window`` messages: no more un-acknowledged at a time than the
    other contenders may have."""
    client, coll = _open(ctx)
    size = ctx.spec["bucket_max_size"]
    buckets = _buckets(ctx, size)
    per_call = max(1, ctx.spec["window"] // size)
    calls = [buckets[k:k + per_call] for k in range(0, len(buckets), per_call)]
    ctx.go()
    for call in calls:
        coll.insert_many([doc for doc, _ in call])
        ctx.mark(sum(n for _, n in call))
    ctx.stop()
    client.close()


async def _insert_round_trips(ctx: Ctx) -> None:
    s = ctx.spec
    client: AsyncMongoClient = AsyncMongoClient(s["uri"], event_listeners=[ctx.commands], w=write_concern(s))
    coll = client[s["db"]][s["queue"]]
    buckets = _buckets(ctx, 1)
    await coll.insert_one({"warm": True})  # the connection is up before the clock starts
    await asyncio.to_thread(ctx.go)
    for doc, _ in buckets:
        started = time.perf_counter()
        await coll.insert_one(doc)
        ctx.sample(started)
    ctx.stop()
    await client.close()


def latency(ctx: Ctx) -> None:
    asyncio.run(_insert_round_trips(ctx))


def consume(ctx: Ctx) -> None:
    client, coll = _open(ctx)
    ctx.go()
    while (bucket := coll.find_one_and_delete({})) is not None:
        for raw in bucket["b"]:
            orjson.loads(raw)
        ctx.mark(len(bucket["b"]))
    ctx.stop(at_last_mark=True)
    client.close()


def _cycle(ctx: Ctx, items: list) -> list:
    """messages items, cycling through a small pool (so RSS shows the codec, not a pre-built input)."""
    return [items[i % len(items)] for i in range(ctx.spec["messages"])]


def encode(ctx: Ctx) -> None:
    ctx.spec["counts_commands"] = False
    items = _cycle(ctx, [payload(i, ctx.pad) for i in range(CODEC_POOL)])
    ctx.go()
    for item in items:
        orjson.dumps(item)
    ctx.mark(len(items))
    ctx.stop()


def decode(ctx: Ctx) -> None:
    ctx.spec["counts_commands"] = False
    raws = _cycle(ctx, [orjson.dumps(payload(i, ctx.pad)) for i in range(CODEC_POOL)])
    ctx.go()
    for raw in raws:
        orjson.loads(raw)
    ctx.mark(len(raws))
    ctx.stop()


if __name__ == "__main__":
    main({"fill": push, "push": push, "push_many": push, "consume": consume, "consume_batch": consume,
          "latency": latency, "encode": encode, "decode": decode})

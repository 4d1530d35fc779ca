"""Naive contender: one document per message, one command per operation.

insert_one per push, find_one_and_update per reserve, delete_one per ack: the shape of keuss's plain
``mongo`` backend, with pymongo's sync client. Each role runs ``concurrency`` threads, but latency, which
times sequential pushes in one thread.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time

from pymongo import MongoClient, ReturnDocument
from pymongo.collection import Collection

from bench.worker import Ctx, main, payload, run_threads, split, write_concern

RESERVE_FOR = dt.timedelta(seconds=30)
POLL_S = 0.005
FILL_CHUNK = 1000


def _open(ctx: Ctx) -> tuple[MongoClient, Collection]:
    s = ctx.spec
    client: MongoClient = MongoClient(
        s["uri"], event_listeners=[ctx.commands], w=write_concern(s), maxPoolSize=2 * s["concurrency"] + 2
    )
    coll = client[s["db"]][s["queue"]]
    coll.create_index("mature")
    return client, coll


def _doc(i: int, pad: str) -> dict:
    return {"mature": dt.datetime.now(dt.timezone.utc), "tries": 0, "payload": payload(i, pad)}


def _produce(ctx: Ctx, coll: Collection, n: int, counted: bool = True) -> None:
    for i in range(n):
        coll.insert_one(_doc(i, ctx.pad))
        if counted:
            ctx.mark()


def _reserve(coll: Collection) -> dict | None:
    now = dt.datetime.now(dt.timezone.utc)
    return coll.find_one_and_update(
        {"mature": {"$lte": now}},
        {"$set": {"mature": now + RESERVE_FOR, "reserved": now}, "$inc": {"tries": 1}},
        sort=[("mature", 1)],
        return_document=ReturnDocument.AFTER,
    )


def _consume(ctx: Ctx, coll: Collection, producers_done: threading.Event, timed_latency: bool) -> None:
    """Reserve and ack until the producers are done and nothing came for idle_s."""
    idle_since: float | None = None
    while True:
        doc = _reserve(coll)
        if doc is not None:
            if timed_latency:
                ctx.latency(doc["payload"]["ts"])
            coll.delete_one({"_id": doc["_id"], "reserved": {"$exists": True}})
            ctx.mark()
            idle_since = None
            continue
        if producers_done.is_set():
            now = time.monotonic()
            idle_since = idle_since or now
            if now - idle_since >= ctx.spec["idle_s"]:
                return
        time.sleep(POLL_S)


def fill(ctx: Ctx) -> None:
    client, coll = _open(ctx)
    ctx.go()
    for n in split(ctx.spec["messages"], -(-ctx.spec["messages"] // FILL_CHUNK) or 1):
        coll.insert_many([_doc(i, ctx.pad) for i in range(n)])
        ctx.mark(n)
    ctx.stop()
    client.close()


def push(ctx: Ctx) -> None:
    client, coll = _open(ctx)
    ctx.go()
    shares = split(ctx.spec["messages"], ctx.spec["concurrency"])
    run_threads([functools.partial(_produce, ctx, coll, n) for n in shares])
    ctx.stop()
    client.close()


def latency(ctx: Ctx) -> None:
    client, coll = _open(ctx)
    coll.insert_one(_doc(-1, ctx.pad))  # the connection is up before the clock starts
    ctx.go()
    for i in range(ctx.spec["messages"]):
        started = time.perf_counter()
        coll.insert_one(_doc(i, ctx.pad))
        ctx.sample(started)
    ctx.stop()
    client.close()


def consume(ctx: Ctx) -> None:
    client, coll = _open(ctx)
    done = threading.Event()
    done.set()
    ctx.go()
    run_threads([functools.partial(_consume, ctx, coll, done, False)] * ctx.spec["concurrency"])
    ctx.stop(at_last_mark=True)
    client.close()


def end_to_end(ctx: Ctx) -> None:
    client, coll = _open(ctx)
    done = threading.Event()
    shares = split(ctx.spec["messages"], ctx.spec["concurrency"])

    def producers() -> None:
        try:
            run_threads([functools.partial(_produce, ctx, coll, n, False) for n in shares])
        finally:
            done.set()

    ctx.go()
    run_threads([producers] + [functools.partial(_consume, ctx, coll, done, True)] * ctx.spec["concurrency"])
    ctx.stop(at_last_mark=True)
    client.close()


if __name__ == "__main__":
    main({"fill": fill, "push": push, "consume": consume, "end_to_end": end_to_end, "latency": latency})

"""Client CPU a command costs through PyMongo's ``AsyncMongoClient`` (what bucketq's claims and flushes use) and
through ``MongoClient`` (what the bench's floor uses), against the test server: ``getrusage`` over
``--calls`` commands after 200 to warm up, each an ``update_one`` of one small document, and, async only, a
``ping``. Uses ``BUCKETQ_MONGODB_URI`` when set, else starts the embedded test server.

    python -m bench.profiling.command_cost [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pymongo import AsyncMongoClient, MongoClient

from bench.worker import _cpu_s  # the process's user and system CPU seconds, as the bench reads them

DB = "bucketq_bench"  # the bench's database, dropped by bench.server around its runs
WARM_UP = 200


async def _async_us(calls: int, command: Callable[[], Awaitable[Any]]) -> float:
    for _ in range(WARM_UP):
        await command()
    started = _cpu_s()
    for _ in range(calls):
        await command()
    return (_cpu_s() - started) / calls * 1e6


def _sync_us(calls: int, command: Callable[[], Any]) -> float:
    for _ in range(WARM_UP):
        command()
    started = _cpu_s()
    for _ in range(calls):
        command()
    return (_cpu_s() - started) / calls * 1e6


async def measure(uri: str, calls: int) -> dict[str, float]:
    """µs of client CPU a command: ``async update_one``, ``async ping``, ``sync update_one``."""
    client: AsyncMongoClient = AsyncMongoClient(uri)
    try:
        coll = client[DB]["command_cost"]
        await coll.replace_one({"_id": 1}, {"x": 0}, upsert=True)
        out = {"async update_one": await _async_us(calls, lambda: coll.update_one({"_id": 1}, {"$inc": {"x": 1}})),
               "async ping": await _async_us(calls, lambda: client.admin.command("ping"))}
    finally:
        await client.close()
    with MongoClient(uri) as sync_client:
        sync_coll = sync_client[DB]["command_cost"]
        out["sync update_one"] = _sync_us(calls, lambda: sync_coll.update_one({"_id": 1}, {"$inc": {"x": 1}}))
        sync_coll.drop()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    from bench.server import server

    with server() as srv:
        print(f"server: {srv.label}")
        for name, us in asyncio.run(measure(srv.uri, args.calls)).items():
            print(f"{name:18} {us:6.0f} µs of client CPU a command")


if __name__ == "__main__":
    main()

"""A producer process for the unique-jobs race test: ``python -m tests.entrypoints.unique_proc URI DB KEYS``.

Opens the queue ``jobs``, prints ``ready``, waits for the document ``{_id: "go"}`` in the collection ``barrier``
(so that every process starts racing at once), then pushes one job for each of the keys ``0`` to ``KEYS - 1`` with
``unique_for``, all at once, and prints the ids the pushes returned as a JSON object ``{key: id}``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from pymongo import AsyncMongoClient

import bucketq


async def main(uri: str, db: str, keys: int) -> None:
    client: AsyncMongoClient = AsyncMongoClient(uri)
    async with bucketq.Queue(client, name="jobs", db=db) as q:
        await q.stats()  # set up: indexes and clock, before the race starts
        print("ready", flush=True)
        while await client[db].barrier.find_one({"_id": "go"}) is None:
            await asyncio.sleep(0.005)
        ids = await asyncio.gather(*(q.push({"key": k}, key=str(k), unique_for=600) for k in range(keys)))
    await client.close()
    print(json.dumps({str(k): i for k, i in enumerate(ids)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))

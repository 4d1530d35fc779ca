"""A scheduler process for the race test: ``python -m tests.entrypoints.scheduler_proc URI DB TICKS``.

Opens the queue ``events``, prints ``ready``, waits for the document ``{_id: "go"}`` in the collection ``barrier``
(so that every process starts racing at once), then runs the schedule ``race`` (every minute) at the test's
clock: its first run at ``START``, then once a minute for ``TICKS`` minutes, as fast as it can. Prints the ticks
it enqueued, as a JSON list of ISO 8601 strings.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys

from pymongo import AsyncMongoClient

import bucketq

START = dt.datetime(2026, 1, 5, 9, 0, 30, tzinfo=dt.timezone.utc)


async def main(uri: str, db: str, ticks: int) -> None:
    client: AsyncMongoClient = AsyncMongoClient(uri)
    async with bucketq.Queue(client, name="events", db=db) as q:
        schedule = bucketq.Schedule(q, "* * * * *", {"job": "race"}, name="race")
        await q.stats()  # set up: indexes and clock, before the race starts
        print("ready", flush=True)
        while await client[db].barrier.find_one({"_id": "go"}) is None:
            await asyncio.sleep(0.005)
        enqueued = []
        for minute in range(ticks + 1):
            enqueued += await schedule.run_once(now=START + dt.timedelta(minutes=minute))
    await client.close()
    print(json.dumps([t.isoformat() for t in enqueued]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))

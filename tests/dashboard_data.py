"""Real data for the dashboard's tests (tests/test_web.py on the in-memory database, tests/test_web_browser.py in a
browser over the test server), and the token that signs in."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bson import ObjectId

import bucketq
from tests.helpers import utc_now

TOKEN = "s3cret-token"


async def fill(target: Any, raw: Any) -> None:
    """Real data for the dashboard: queue ``orders`` with 20 messages, of which 3 dead letters (their reasons say
    why) and one more bucket quarantined (``raw`` is a synchronous handle on the database, to write it as it is);
    queue ``emails`` with 5 ready and 5 scheduled messages; stream ``events`` of 30 messages, reader group
    ``audit`` at its beginning (30 behind) and ``billing`` at its end."""
    past = utc_now() - dt.timedelta(seconds=60)
    raw["orders"].insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": past, "due": past, "n": 1,
                              "p": ["{not json"], "done": [], "c": 0, "lease": None})
    async with bucketq.Queue(target, name="orders", bucket_max_wait=0.005, drain_timeout=0) as orders:
        await orders.push_many([{"order": i} for i in range(20)])
        for error in ("card declined", "address unknown", "timeout calling the warehouse"):
            message = await orders.reserve(timeout=2)
            assert message is not None
            await message.dead_letter(error=error, wait=True)
    async with bucketq.Queue(target, name="emails", bucket_max_wait=0.005) as emails:
        await emails.push_many([{"to": f"user{i}"} for i in range(5)])
        await emails.push_many([{"to": f"later{i}"} for i in range(5)], delay=3600)
    async with bucketq.Stream(target, name="events") as events:
        await events.push_many([{"event": i} for i in range(30)])
        await events.flush()
        await events.reset("audit", "beginning")
        await events.reset("billing", "end")

"""Change streams of ``bucketq.memory``: insert, update and replace events, to the streams open at the time
and, for a stream opened with ``start_at_operation_time``, from the last few seconds."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import bson
from bson import Timestamp
from pymongo.errors import InvalidOperation

from bucketq.memory.engine import STORED, Unsupported, aggregate_documents, compare


class Streams:
    """Change streams of one client: the open ones, and the inserts of the last few seconds, for a stream
    opened with ``start_at_operation_time``."""

    KEEP_S = 10.0

    def __init__(self) -> None:
        self.open: set[ChangeStream] = set()
        self.recent: deque[tuple[Timestamp, str, str, bytes, str, dict[str, Any] | None]] = deque()
        self._last = Timestamp(0, 0)

    def publish(self, database: str, collection: str, raw: bytes, *, operation: str = "insert",
                description: dict[str, Any] | None = None) -> None:
        """A write of document ``raw`` (as it is now): an ``insert``, a ``replace``, or an ``update`` with
        its ``description`` (``updateDescription``)."""
        seconds = int(time.time())
        self._last = Timestamp(seconds, self._last.inc + 1 if seconds == self._last.time else 1)
        event = (self._last, database, collection, raw, operation, description)
        self.recent.append(event)
        while self.recent and self.recent[0][0].time < seconds - self.KEEP_S:
            self.recent.popleft()
        for stream in list(self.open):
            stream.offer(*event)


# -- the sync interface (engine) -------------------------------------------------------------------------


class ChangeStream:
    """Change events of one collection (inserts, updates and replacements: deletes make none), through
    ``$match`` and ``$project`` stages. Update events carry the document as it is after the update only with
    ``lookup`` (``full_document="updateLookup"``)."""

    def __init__(self, streams: Streams, database: str, collection: str, pipeline: list[Mapping[str, Any]],
                 max_await_s: float, start: Timestamp | None, *, lookup: bool = False) -> None:
        self._streams = streams
        self._lookup = lookup
        self._ns = {"db": database, "coll": collection}
        for stage in pipeline:
            if set(stage) - {"$match", "$project"}:
                raise Unsupported("change streams of bucketq.memory take $match and $project stages only")
        self._pipeline = pipeline
        self._max_await_s = max_await_s
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        if start is not None:
            for event in streams.recent:
                if compare(event[0], start) >= 0:
                    self.offer(*event)
        streams.open.add(self)
        self.alive = True

    def offer(self, at: Timestamp, database: str, collection: str, raw: bytes, operation: str,
              description: dict[str, Any] | None) -> None:
        """Queue a change event for this stream when the write at ``at`` is in its namespace and matches."""
        if (database, collection) != (self._ns["db"], self._ns["coll"]):
            return
        doc = bson.decode(raw, codec_options=STORED)
        event = {"_id": {"_data": f"{at.time:08x}{at.inc:08x}"}, "operationType": operation, "clusterTime": at,
                 "ns": dict(self._ns), "documentKey": {"_id": doc["_id"]}}
        if operation == "update":
            event["updateDescription"] = description
        if operation != "update" or self._lookup:
            event["fullDocument"] = doc
        for passed in aggregate_documents([event], self._pipeline):
            self._events.put_nowait(dict(passed))

    async def try_next(self) -> dict[str, Any] | None:
        if not self.alive:
            raise InvalidOperation("the change stream is closed")
        try:
            return await asyncio.wait_for(self._events.get(), self._max_await_s)
        except TimeoutError:
            return None

    async def next(self) -> dict[str, Any]:
        while True:
            event = await self.try_next()
            if event is not None:
                return event

    def __aiter__(self) -> ChangeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self.next()

    async def close(self) -> None:
        self.alive = False
        self._streams.open.discard(self)

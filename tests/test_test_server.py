"""The embedded test server's launcher (devtools/testserver/Launcher.java), where it differs from
mongo-java-server to behave as MongoDB does."""

from __future__ import annotations

import time
from typing import Any

import pytest
from bson import Timestamp
from pymongo import AsyncMongoClient

from devtools.testserver import TestServer

pytestmark = pytest.mark.server


async def test_a_change_stream_from_before_a_restart_is_resumed_not_handed_another_clients_cursor() -> None:
    """A getMore on a cursor of the server before its restart is refused (CursorNotFound), as on MongoDB, and the
    driver resumes the stream. Before: cursor ids restarted at 1, so that getMore read the restarted server's
    cursor of the same number, another client's stream on another collection, and the stream fell deaf."""
    with TestServer() as server:
        mine: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
        other: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
        try:
            stream = await mine.db.mine.watch(start_at_operation_time=Timestamp(int(time.time()) - 1, 0),
                                              max_await_time_ms=100)
            await stream.try_next()  # the stream's cursor is open on the first server
            server.restart()
            await mine.db.mine.find_one()  # a new connection, where the stream's next getMore goes
            # Cursors of the restarted server, kept open: before, the first of them had the stream's id.
            others = [await other.db.other.watch(start_at_operation_time=Timestamp(int(time.time()) - 1, 0))
                      for _ in range(3)]
            await mine.db.mine.insert_one({"after": "the restart"})
            heard = None
            deadline = time.monotonic() + 10
            while heard is None and time.monotonic() < deadline:
                heard = await stream.try_next()
            assert heard is not None and heard["fullDocument"]["after"] == "the restart"
            assert all(o.alive for o in others)
        finally:
            await mine.close()
            await other.close()

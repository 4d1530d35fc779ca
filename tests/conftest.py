"""Shared fixtures: a real MongoDB-wire server for every test.

With ``BUCKETQ_MONGODB_URI`` set the tests run against that server; otherwise one mongo-java-server is
started for the session and stopped by PID at the end (also when the run is interrupted).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from pymongo import AsyncMongoClient, MongoClient

from devtools.testserver import TestServer
from tests.features import server_features


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    uri = os.environ.get("BUCKETQ_MONGODB_URI")
    if uri:
        yield uri
        return
    with TestServer() as server:
        yield server.uri


@pytest.fixture(scope="session")
def features(mongo_uri: str) -> frozenset[str]:
    return server_features(mongo_uri)


@pytest.fixture(autouse=True)
def _skip_missing_features(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("needs")
    if marker is None:
        return
    have = request.getfixturevalue("features")
    missing = [f for f in marker.args if f not in have]
    if missing:
        pytest.skip(f"the server lacks {', '.join(missing)} (mongo-java-server has no such support)")


@pytest.fixture
def db_name() -> str:
    """A database of the test's own, dropped afterwards."""
    return f"bq_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sync_db(mongo_uri: str, db_name: str) -> Iterator:
    client: MongoClient = MongoClient(mongo_uri)
    yield client[db_name]
    client.drop_database(db_name)
    client.close()


@pytest.fixture
async def async_client(mongo_uri: str) -> AsyncIterator[AsyncMongoClient]:
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    yield client
    await client.close()


@pytest.fixture
async def adb(async_client: AsyncMongoClient, db_name: str) -> AsyncIterator:
    """An ``AsyncDatabase`` of the test's own."""
    yield async_client[db_name]
    await async_client.drop_database(db_name)


@pytest.fixture
async def make_queue(mongo_uri: str, db_name: str, sync_db) -> AsyncIterator:
    """``make_queue(name="events", target=None, **options)``: Queues on the test's database, closed after."""
    import bucketq

    made: list[bucketq.Queue] = []

    def make(name: str = "events", target: object = None, **options: object) -> bucketq.Queue:
        queue = bucketq.Queue(target or mongo_uri, name=name, db=db_name, **options)
        made.append(queue)
        return queue

    yield make
    for queue in made:
        try:
            await queue.close()
        except Exception:  # a test may have left it failing on purpose (cut connection, stopped server)
            pass

"""Shared fixtures: a real MongoDB-wire server, or the in-memory database, for every test.

With ``BUCKETQ_MONGODB_URI`` set the server tests run against that server; otherwise one mongo-java-server is
started for the session (only when a test needs it) and stopped by PID at the end (also when the run is
interrupted).

Backends: ``make_queue``, ``sync_db`` and ``queue_target`` put queues on the ``backend``, "server" by
default. A module marked ``pytest.mark.backends("memory", "server")`` runs each of its tests that use them
on both: on the in-memory database of ``bucketq.memory`` (no JVM) and on the server. A test that asks for
``mongo_uri`` (directly or through ``adb``, ``async_client``, ``features``), or is marked ``needs``, runs on
the server only; one that asks for ``memory_db`` (to inject faults, read the operation log) on memory only.
Every test that needs the server is marked ``server``, every one on the in-memory database ``memory``, and
every one that needs no server (nor a JVM) and is not ``slow`` is marked ``unit``: ``make unit`` runs ``-m unit``,
which starts no JVM (``make test-pythons`` runs it first on the other Pythons, then the rest but Spark's and the
browser's). A test that starts a server of its own (in a subprocess) carries ``pytest.mark.server`` itself.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pymongo.common
import pytest
from hypothesis import settings
from pymongo import AsyncMongoClient, MongoClient

from bucketq.memory import MemoryClient, MemoryDatabase
from devtools.testserver import TestServer
from tests.features import server_features

# tests.cli_runner: the bq fixture of the CLI tests; pytester: tests/test_watchdog.py runs a hung test
pytest_plugins = ["tests.watchdog", "tests.fast_clock", "tests.cli_runner", "pytester"]

# Hypothesis profiles, chosen by $BUCKETQ_HYPOTHESIS_PROFILE before any test module is imported: "default" (the
# full counts: make test), or "unit" (make unit), a tenth of every property test's examples, the counts that
# tests set themselves too (tests.helpers.examples): the fast tier spent half its CPU time in them. The bounds a
# few examples could miss get an @example (test_properties.py: the split bound).
settings.register_profile("unit", max_examples=10)
settings.load_profile(os.environ.get("BUCKETQ_HYPOTHESIS_PROFILE", "default"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is None:
        return
    if "memory_db" in metafunc.fixturenames:
        backends = ["memory"]
    elif "mongo_uri" in metafunc.fixturenames or metafunc.definition.get_closest_marker("needs"):
        return
    else:
        backends = list(marker.args)
    metafunc.parametrize("backend", backends, indirect=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep the collected suite (its modules, items, strategies) out of every later garbage collection: the
    collector otherwise walks it again and again while the tests run (4% of the unit tier's time)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        backend = getattr(item, "callspec", None) and item.callspec.params.get("backend")
        fixtures = getattr(item, "fixturenames", ())
        if ("mongo_uri" in fixtures or backend == "server" or (backend is None and "backend" in fixtures)
                or item.get_closest_marker("needs") or item.get_closest_marker("spark")):
            item.add_marker(pytest.mark.server)
        elif backend == "memory" or "memory_db" in fixtures:
            item.add_marker(pytest.mark.memory)
        if not item.get_closest_marker("server") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.unit)


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
def closed_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """A loopback port nothing listens on: bound, read, closed. A client of it is refused at once, but pymongo's
    server selection then waits out its minimum heartbeat (0.5 s) before it gives up, even past a shorter
    serverSelectionTimeoutMS: shortened here (as pymongo's own tests do), it was 20 s of the unit tier's summed
    test time (tests/test_secrets.py)."""
    monkeypatch.setattr(pymongo.common, "MIN_HEARTBEAT_INTERVAL", 0.01)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def everything_logged(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], str]]:
    """The text of every log record (every logger, from DEBUG) and every warning of the test so far."""
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield lambda: caplog.text + "".join(str(w.message) for w in caught)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """"server" or "memory": see the module's docstring."""
    return getattr(request, "param", "server")


@pytest.fixture
def memory_db(db_name: str) -> MemoryDatabase:
    """The test's own in-memory database (``bucketq.memory``), on a client of its own, in ``notablescan`` mode:
    a query that no index serves fails the test (whole-collection reads an operator asks for say so:
    ``bucketq.core.scans``)."""
    return MemoryClient(notablescan=True)[db_name]


@pytest.fixture
def queue_target(backend: str, request: pytest.FixtureRequest) -> Any:
    """What a test's queues connect to: the server's URI, or the in-memory database."""
    return request.getfixturevalue("memory_db" if backend == "memory" else "mongo_uri")


@pytest.fixture
def sync_db(backend: str, request: pytest.FixtureRequest, db_name: str) -> Iterator:
    """A synchronous handle on the test's database, to seed and inspect it: a PyMongo ``Database`` (dropped
    afterwards), or the in-memory database's ``sync`` view."""
    if backend == "memory":
        yield request.getfixturevalue("memory_db").sync
        return
    client: MongoClient = MongoClient(request.getfixturevalue("mongo_uri"))
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


async def _close_all(made: list[Any]) -> None:
    """Close what ``make_queue`` or ``make_stream`` made, whatever state a test left it in."""
    for thing in made:
        try:
            await thing.close()
        except Exception:  # a test may have left it failing on purpose (cut connection, stopped server)
            pass


@pytest.fixture
async def make_queue(queue_target: Any, db_name: str, sync_db) -> AsyncIterator:
    """``make_queue(name="events", target=None, **options)``: Queues on the test's database, closed after; then
    the callables given to ``make_queue.after_close`` run (a proxy the queues talk through: stopped by a finalizer,
    it would stop first, since finalizers run last registered first, and each close would wait for it in vain)."""
    import bucketq

    made: list[bucketq.Queue] = []
    after_close: list[Callable[[], object]] = []

    def make(name: str = "events", target: object = None, **options: object) -> bucketq.Queue:
        queue = bucketq.Queue(target or queue_target, name=name, db=db_name, **options)
        made.append(queue)
        return queue

    make.after_close = after_close.append  # type: ignore[attr-defined]
    yield make
    await _close_all(made)
    for then in after_close:
        then()


@pytest.fixture
async def make_stream(queue_target: Any, db_name: str, sync_db) -> AsyncIterator:
    """As ``make_queue``, for ``bucketq.Stream``s, with quick polls and flushes."""
    import bucketq

    made: list[bucketq.Stream] = []

    def make(name: str = "ev", target: object = None, **options: object) -> bucketq.Stream:
        options = {"poll_interval": 0.01, "state_flush_period": 0.05, **options}
        stream = bucketq.Stream(target or queue_target, name=name, db=db_name, **options)
        made.append(stream)
        return stream

    yield make
    await _close_all(made)

"""Which pymongo talks to which server: the releases the tests run are the ones bucketq names, and a server the
installed pymongo refuses is said as that, in bucketq's ``ServerRefused``, by the library and by the CLI.

The refused server is the test server with mongo-java-server's own handshake (wire version 8): pymongo 4.18 and
later refuse it, 4.13 to 4.17 talk to it. So on the oldest pymongo the range allows the same tests check that it
does talk, as the error's advice says."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest
from pymongo import common
from pymongo.errors import ConfigurationError

import bucketq
from bucketq.batch import BatchQueue
from bucketq.shell.compatibility import TESTED_PYMONGO
from devtools.pythons import EXTRA_PINS
from devtools.testserver import TestServer

REPO = Path(__file__).resolve().parent.parent
WIRE_8_REFUSED = common.MIN_SUPPORTED_WIRE_VERSION > 8


@pytest.fixture(scope="module")
def wire_8() -> Iterator[TestServer]:
    with TestServer(shipped_handshake=True) as server:
        yield server


@pytest.fixture
def wire_8_uri(wire_8: TestServer) -> str:
    return wire_8.uri + "bq_compat?serverSelectionTimeoutMS=10000"


def test_the_tested_releases_are_the_ends_of_the_range_and_the_pins() -> None:
    oldest, newest = TESTED_PYMONGO
    pins = {line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()}
    assert f"pymongo=={newest}" in pins and f"pymongo=={oldest}" in EXTRA_PINS.values()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    allowed = next(d for d in dependencies if d.startswith("pymongo"))
    low, high = re.fullmatch(r"pymongo>=([\d.]+),<([\d.]+)", allowed).groups()  # type: ignore[union-attr]
    major, minor = newest.split(".")[:2]
    assert oldest.startswith(low + ".") and high == f"{major}.{int(minor) + 1}"  # up to the newest tested minor


def test_the_installed_release_accepts_the_wire_versions_bucketq_says() -> None:
    if pymongo.version not in TESTED_PYMONGO:
        pytest.skip(f"pymongo {pymongo.version} is not one of the releases bucketq is tested with")
    assert TESTED_PYMONGO[pymongo.version] == (common.MIN_SUPPORTED_WIRE_VERSION, common.MAX_SUPPORTED_WIRE_VERSION)


def _says_refused(message: str, server: TestServer) -> None:
    assert f"the MongoDB server at 127.0.0.1:{server.port} speaks wire versions 0 to 8, and the installed pymongo " \
           f"{pymongo.version} only {common.MIN_SUPPORTED_WIRE_VERSION} to " in message, message
    oldest = next(iter(TESTED_PYMONGO))
    assert f"pymongo {oldest} talks to it (pip install 'pymongo=={oldest}')" in message, message


@pytest.mark.server
async def test_the_library_says_a_server_its_pymongo_refuses(wire_8: TestServer, wire_8_uri: str) -> None:
    queue = bucketq.Queue(wire_8_uri, name="events")
    try:
        if WIRE_8_REFUSED:
            with pytest.raises(bucketq.ServerRefused) as caught:
                await queue.push({"n": 1})
            _says_refused(str(caught.value), wire_8)
            assert isinstance(caught.value, ConfigurationError)  # caught as before bucketq said it
        else:
            await queue.push({"n": 1})
            message = await queue.reserve(timeout=5)
            assert message is not None and message.payload == {"n": 1}
            await message.ack()
    finally:
        await queue.close()


@pytest.mark.server
def test_the_sync_batch_queue_says_a_server_its_pymongo_refuses(wire_8: TestServer, wire_8_uri: str) -> None:
    batches = BatchQueue(wire_8_uri, name="batch_events")
    try:
        if WIRE_8_REFUSED:
            with pytest.raises(bucketq.ServerRefused) as caught:
                batches.claim(1)
            _says_refused(str(caught.value), wire_8)
        else:
            assert batches.claim(1) is None  # an empty queue, read over the connection
    finally:
        batches.close()


@pytest.mark.server
def test_the_cli_says_a_server_its_pymongo_refuses(wire_8: TestServer, wire_8_uri: str) -> None:
    result = subprocess.run([sys.executable, "-m", "bucketq.cli", "push", "events", '{"n": 1}', "--uri", wire_8_uri],
                            capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)
    if WIRE_8_REFUSED:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("Error: ServerRefused: ") and "invalid MongoDB URI" not in result.stderr
        _says_refused(result.stderr, wire_8)
    else:
        assert result.returncode == 0, result.stderr

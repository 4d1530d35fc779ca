"""The guide's web service (docs/guide/web-service.md, examples/web_service.py) under uvicorn: requests answered
before and while SIGTERM stops the server are each stored once, and the lifespan's exit (the queue's close)
completes; and what the guide says of its shutdown: leaving ``async with`` drains, with no ``drain()`` call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import bucketq
from devtools.testserver import free_port
from tests.helpers import answers, eventually

pytestmark = pytest.mark.backends("memory", "server")
ROOT = Path(__file__).resolve().parent.parent


async def post_order(port: int, order: int) -> str | None:
    """POST ``{"order": order}``; the message id of a 202, or None when the server did not answer (it stopped)."""
    body = json.dumps({"order": order}).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /orders HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        response = await reader.read()
        writer.close()
    except OSError:
        return None
    head, _, payload = response.partition(b"\r\n\r\n")
    if not head:
        return None
    assert head.split()[1] == b"202", response
    return json.loads(payload)["id"]


async def test_a_web_service_stopped_by_sigterm_stores_every_acknowledged_push_once(mongo_uri: str,
                                                                                    db_name: str) -> None:
    scheme, hosts, _, query, _ = urlsplit(mongo_uri)
    uri = urlunsplit((scheme, hosts, f"/{db_name}", query, ""))
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "web_service:app", "--app-dir", "examples", "--host", "127.0.0.1",
        "--port", str(port), cwd=ROOT, env={**os.environ, "BUCKETQ_MONGODB_URI": uri},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert server.stderr is not None
        # the port answering, not uvicorn's "Application startup complete": that line comes before it binds
        await eventually(lambda: answers(port) or server.returncode is not None, what="uvicorn to listen")
        assert server.returncode is None, "uvicorn stopped before serving:\n" + (await server.stderr.read()).decode()
        answered = await asyncio.gather(*(post_order(port, i) for i in range(100)))
        assert all(answered), "every request before the SIGTERM is answered"
        late = [asyncio.ensure_future(post_order(port, i)) for i in range(100, 200)]
        await asyncio.wait(late, return_when=asyncio.FIRST_COMPLETED)
        server.send_signal(signal.SIGTERM)  # with requests in flight
        answered += await asyncio.gather(*late)
        log = [line.decode() async for line in server.stderr]
        # uvicorn re-raises the signal once it has shut down, so that its exit status tells why it stopped
        assert await asyncio.wait_for(server.wait(), 30) == -signal.SIGTERM, "".join(log)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    assert any("Application shutdown complete" in line for line in log), "".join(log)

    stored: dict[str, int] = {}
    async with bucketq.Queue(uri, name="orders") as queue:
        while batch := await queue.reserve_many(1000, timeout=0.5):
            for message in batch:
                assert message.id not in stored, f"{message.id} stored twice"
                stored[message.id] = message.payload["order"]
                await message.ack()
    acknowledged = [i for i in answered if i is not None]
    assert len(acknowledged) > 100
    print(f"{len(acknowledged)} answered, {len(stored)} stored")
    assert set(acknowledged) <= set(stored), "a push answered 202 is missing"
    assert sorted(stored.values()) == sorted(set(stored.values())) and set(stored.values()) <= set(range(200))


async def test_leaving_async_with_drains_so_no_drain_call_is_needed(make_queue):
    async with make_queue(change_streams=False) as q:
        await q.push_many(["a", "b", "c"])
        held = await q.reserve(timeout=2)  # its bucket, with "b" and "c" unserved, is held by this queue
        await held.ack()
        pending = [q.push_nowait(str(i)) for i in range(3)]  # not awaited
    assert all(future.done() and future.exception() is None for future in pending)
    other = make_queue(change_streams=False)
    got = await other.reserve_many(100, timeout=2)  # at once: the held bucket was handed back, not left to its lease
    assert sorted(m.payload for m in got) == ["0", "1", "2", "b", "c"] and {m.tries for m in got} == {0}
    for message in got:
        await message.ack()

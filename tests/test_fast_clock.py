"""The clock that skips idle waits on the in-memory database (tests/fast_clock.py): what it skips, and what not."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

import bucketq
from tests.fast_clock import real_monotonic, real_time


async def test_an_idle_wait_on_the_in_memory_database_takes_no_real_time(memory_db):
    mono, wall, real = time.monotonic(), time.time(), real_monotonic()
    await asyncio.sleep(200)
    assert real_monotonic() - real < 5
    assert time.monotonic() - mono >= 200 and time.time() - wall >= 200
    assert abs((time.time() - wall) - (time.monotonic() - mono)) < 0.1, "the two clocks moved apart"


async def test_a_lease_passes_without_its_real_time_and_the_bucket_comes_back(memory_db):
    """The library and the in-memory database read the moved clock alike: a lease of two minutes passes."""
    async with bucketq.Queue(memory_db, name="events", lease=120, bucket_max_wait=0.005) as queue:
        await queue.push("x")
        lost = memory_db.faults.lose_reply("findAndModify")  # claimed, but its holder never knew
        mono, real = time.monotonic(), real_monotonic()
        message = await queue.reserve(timeout=240)
        assert lost.hits == 1 and message is not None and message.payload == "x"
        assert time.monotonic() - mono >= 120, "served before the lost claim's lease ran out"
        assert real_monotonic() - real < 5
        await message.ack(wait=True)


def _write_later(sock: socket.socket, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), sock.send(b"!")))
    thread.start()
    return thread


async def _read_within(seconds: float) -> bytes:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader, writer = await asyncio.open_connection(sock=ours)
        thread = _write_later(theirs, 0.05)
        try:
            return await asyncio.wait_for(reader.read(1), seconds)
        finally:
            thread.join()
            writer.close()


async def test_a_wait_for_a_thread_skips_its_timeout_so_such_tests_keep_real_time(memory_db):
    with pytest.raises(TimeoutError):  # the thread's write comes 0.05 s later in real time: too late here
        await _read_within(60)


@pytest.mark.real_time
async def test_a_test_marked_real_time_waits_in_real_time(memory_db):
    real = real_monotonic()
    assert await _read_within(60) == b"!"
    assert 0.05 <= real_monotonic() - real < 5


async def test_a_test_on_no_in_memory_database_waits_in_real_time():
    real, wall = real_monotonic(), real_time()
    await asyncio.sleep(0.05)
    assert real_monotonic() - real >= 0.05
    assert abs(time.time() - real_time()) < 0.1, "the wall clock stayed moved after a test on the in-memory database"
    assert time.time() - wall < 5

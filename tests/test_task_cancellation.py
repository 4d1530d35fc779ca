"""A cancel that arrives during a driver call can be swallowed by the driver, or come back as a PyMongoError.
The library's loops must stop all the same, or ``close()`` waits on them forever (seen in CI: a queue's close
hung on its housekeeping task, which had gone back to sleep after a swallowed cancel)."""

from __future__ import annotations

import asyncio

from pymongo.errors import AutoReconnect

from bucketq.shell.collection_setup import every
from bucketq.store.aio.base import retrying


async def test_housekeeping_stops_when_a_driver_call_swallows_the_cancel() -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what a driver call may do with a cancel

    task = asyncio.get_running_loop().create_task(every(3600, work, "test housekeeping"))
    await started.wait()
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 2)
    assert task.cancelled()


async def test_retrying_stops_when_a_cancel_comes_back_as_a_driver_error() -> None:
    calls = 0

    async def op(retry: bool) -> None:
        nonlocal calls
        calls += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise AutoReconnect("connection closed by the cancel") from None  # transient: would be retried

    task = asyncio.get_running_loop().create_task(retrying(op, timeout_s=30))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 2)
    assert task.cancelled() and calls == 1

"""``HandlerThreads``: where a ``Worker`` runs a sync handler: at most ``size`` calls at once, each on a daemon
thread of a small pool, awaited from the event loop.

A thread cannot be cancelled: a call that the worker stops waiting for (``handler_timeout``, or ``drain_timeout``
on stop) runs on, and keeps its slot until it returns, so that the calls running never exceed ``size``. The
threads are daemon threads so that a process whose worker has stopped can exit while such a call still runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any

_Work = tuple[Callable[[Any], Any], Any, "concurrent.futures.Future[Any]"]


class HandlerThreads:
    """Slots for ``size`` sync calls: ``take`` one (on the loop), then ``run`` the call in it, or ``give_back``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.taken = 0  # slots taken: calls running (those cut off included) and calls about to start
        self._freed = asyncio.Event()
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    async def take(self, timeout: float) -> bool:
        """Take a slot, waiting up to ``timeout`` seconds for one to be given back; False when none was."""
        if self.taken >= self.size:
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), timeout)
            except TimeoutError:
                return False
            if self.taken >= self.size:  # another taker was first
                return False
        self.taken += 1
        return True

    def give_back(self) -> None:
        self.taken -= 1
        self._freed.set()

    def run(self, function: Callable[[Any], Any], argument: Any) -> asyncio.Future[Any]:
        """Call ``function(argument)`` on a thread, in a slot taken before; the slot is given back when the call
        returns. Cancelling the future returned stops a call that has not started, and stops waiting for one
        that has (it runs on)."""
        loop = asyncio.get_running_loop()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        done.add_done_callback(lambda _: _call_soon(loop, self.give_back))
        if len(self._threads) < self.taken:  # fewer threads than slots taken: none may be idle
            thread = threading.Thread(target=_serve, args=(self._work,), daemon=True,
                                      name=f"bucketq-handler-{len(self._threads)}")
            thread.start()
            self._threads.append(thread)
        self._work.put((function, argument, done))
        return asyncio.wrap_future(done, loop=loop)

    def close(self) -> None:
        """Let every thread end once its current call (if any) returns."""
        for _ in self._threads:
            self._work.put(None)
        self._threads.clear()


def _serve(work: queue.SimpleQueue[_Work | None]) -> None:
    while (item := work.get()) is not None:
        function, argument, done = item
        del item
        if done.set_running_or_notify_cancel():
            try:
                result = function(argument)
            except BaseException as exc:  # handed to the loop, which decides the message's fate
                done.set_exception(exc)
            else:
                done.set_result(result)
        del function, argument, done


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop``, from any thread; nothing once the loop is closed (no worker waits for a slot)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass

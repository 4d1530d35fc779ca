"""A clock that skips idle waits, for the tests on the in-memory database (a pytest plugin, loaded by conftest).

``bucketq.memory`` runs inside the test's event loop, so when every task of the loop waits for a timer (a lease
to pass, a retry delay, a poll interval, a fault's delay) nothing can happen before the first timer fires. Those
waits were most of the unit tier's time: real seconds in which the loop did nothing. Here the loop's selector,
asked to sleep ``t`` seconds while no file is ready, returns at once and moves the clock on by ``t``.

The clock is ``time.monotonic`` (read by asyncio's loop and by bucketq's ``ServerClock``, deadlines and
timeouts) and ``time.time`` (read by the in-memory database's ``hello.localTime`` and change-stream times), both
moved by the same amount. CPU time still passes as it did, so leases, delays and timeouts keep their order and
their margins: only the idle gaps between them are gone. The tests on the server keep real time (its clock
cannot be moved), and run every one of these tests as well.

A test on the in-memory database that waits for a thread or a subprocess (whose end the loop cannot foresee, so
skipping would fire its timers early) is marked ``real_time``; a test elsewhere whose waits are all in its loop
can be marked ``fast_clock``. Tests that compare with the wall clock read it as the library does: ``time.time``
(``tests.helpers.utc_now``), not ``datetime.now``.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Iterator
from typing import Any

import pytest

# The clocks this plugin replaces, as they were: what a test of the plugin compares with (tests/test_fast_clock.py).
real_monotonic = time.monotonic
real_time = time.time


class FastClock:
    """``time.monotonic`` and ``time.time``, plus the seconds skipped while on."""

    def __init__(self) -> None:
        self.on = False
        self.skipped = 0.0  # since the session began: monotonic never goes back
        self._skipped_at_start = 0.0  # the wall clock is moved only during a test, and back after it

    def monotonic(self) -> float:
        return real_monotonic() + self.skipped

    def time(self) -> float:
        return real_time() + (self.skipped - self._skipped_at_start if self.on else 0.0)

    def start(self) -> None:
        self._skipped_at_start = self.skipped
        self.on = True

    def stop(self) -> None:
        self.on = False

    def skip(self, seconds: float) -> None:
        self.skipped += seconds


CLOCK = FastClock()


class SkippingSelector(selectors.BaseSelector):
    """The platform's selector, but a wait with a timeout and nothing ready skips the timeout."""

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if not CLOCK.on or timeout is None or timeout <= 0:
            return self._inner.select(timeout)
        ready = self._inner.select(0)
        if not ready:
            CLOCK.skip(timeout)
        return ready

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class SkippingLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__(SkippingSelector())


class SkippingPolicy(asyncio.DefaultEventLoopPolicy):
    _loop_factory = SkippingLoop


_previous_policy: asyncio.AbstractEventLoopPolicy | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _previous_policy
    time.monotonic, time.time = CLOCK.monotonic, CLOCK.time
    _previous_policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(SkippingPolicy())


def pytest_unconfigure(config: pytest.Config) -> None:
    time.monotonic, time.time = real_monotonic, real_time
    if _previous_policy is not None:
        asyncio.set_event_loop_policy(_previous_policy)


@pytest.fixture(autouse=True)
def _fast_clock(request: pytest.FixtureRequest) -> Iterator[None]:
    node = request.node
    skips = node.get_closest_marker("memory") or node.get_closest_marker("fast_clock")
    if not skips or node.get_closest_marker("real_time"):
        yield
        return
    CLOCK.start()
    try:
        yield
    finally:
        CLOCK.stop()

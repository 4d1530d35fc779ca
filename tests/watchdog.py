"""A watchdog for hung async tests (a pytest plugin, loaded by tests/conftest.py).

pytest-timeout's signal method raises in whatever code runs when the time is up: in an async test that is
often another task (a retry loop, a flusher), which dies while the test's own coroutine goes on waiting, so
the test never ends. Here each async test's own task is cancelled when its timeout (the ``timeout`` marker,
``--timeout`` or the ``timeout`` ini value, as pytest-timeout reads them) runs out, and the test fails saying
which test, after how long, and where every task of its loop was stuck. pytest-timeout stays as the last
resort for code that swallows the cancel (or blocks the loop): for async tests it uses its thread method
``GRACE_S`` later, which dumps every thread's stack and ends the process.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from pytest_timeout import pytest_timeout_set_timer as _set_timer

GRACE_S = 30.0  # time the cancelled test gets to unwind (its finally blocks, its fixtures) before the last resort
LIMIT = pytest.StashKey[float]()


def _is_async(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a run with -p no:timeout has no such hook
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """For an async test, keep its timeout for the watchdog and set pytest-timeout's thread method later."""
    if not _is_async(item):
        return None
    item.stash[LIMIT] = settings.timeout
    return _set_timer(item, settings._replace(timeout=settings.timeout + GRACE_S, method="thread"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    limit = item.stash.get(LIMIT, None)
    if limit is None or not _is_async(item):
        return (yield)
    assert isinstance(item, pytest.Function)
    test = item.obj
    item.obj = _watched(test, limit, item.nodeid)  # pytest-asyncio runs item.obj in its loop at call time
    try:
        return (yield)
    finally:
        item.obj = test


def _watched(test: Callable[..., Coroutine], limit: float, name: str) -> Callable[..., Coroutine]:
    @functools.wraps(test)
    async def watched(*args: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        stuck: list[str] = []

        def expire() -> None:
            stuck.append(_stacks(task))
            task.cancel(f"the watchdog: {name} ran past {limit:g} s")

        timer = asyncio.get_running_loop().call_later(limit, expire)
        try:
            result = await test(*args, **kwargs)
        except BaseException as exc:
            if not stuck:
                raise
            ended = "" if isinstance(exc, asyncio.CancelledError) else f" (it ended with {exc!r})"
        else:
            if not stuck:
                return result
            ended = " (it swallowed the cancel and returned)"
        finally:
            timer.cancel()
        task.uncancel()
        pytest.fail(f"{name} did not finish within its timeout of {limit:g} s: cancelled by the watchdog "
                    f"(tests/watchdog.py){ended}. Where each task was:\n{stuck[0]}", pytrace=False)

    return watched


def _stacks(first: asyncio.Task) -> str:
    """Every task of the running loop with the chain of coroutines where it waits, the test's own task first
    (``Task.get_stack`` gives only the outermost frame of a suspended task)."""
    out = []
    for task in sorted(asyncio.all_tasks(), key=lambda t: t is not first):
        frames = []
        awaited: Any = task.get_coro()
        while (frame := getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)) is not None:
            frames.append((frame, frame.f_lineno))
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        out.append(f"task {task.get_name()!r}:\n" + "".join(traceback.StackSummary.extract(frames).format()))
    return "".join(out)

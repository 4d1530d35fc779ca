"""tests/watchdog.py ends a hung async test with a clear failure, even when the code that loops is another task
(where pytest-timeout's signal method would raise, leaving the test waiting)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import SUBPROCESS_PYTEST_PLUGINS_OFF

ROOT = Path(__file__).resolve().parent.parent

HUNG = '''
import asyncio

import pytest


@pytest.mark.timeout(0.5)
async def test_hung_while_a_task_retries():
    async def retry_forever():
        while True:
            try:
                await asyncio.sleep(0.01)
            except Exception:  # what pytest-timeout's signal method would raise here is swallowed like a driver error
                pass

    retrying = asyncio.create_task(retry_forever())
    await asyncio.Event().wait()


@pytest.mark.timeout(0.5)
async def test_swallows_the_cancel():
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass  # and returns as if it had passed


@pytest.mark.timeout(5)
async def test_quick():
    await asyncio.sleep(0)


def test_sync():
    pass
'''


def test_a_hung_async_test_fails_saying_which_after_how_long_and_where_each_task_was(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_hung=HUNG)
    # the subprocess runs in a temporary folder: the plugin is found from the checkout, as in this process
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("-p", "tests.watchdog", "-o", "asyncio_mode=auto",
                                           "-o", "asyncio_default_fixture_loop_scope=function",
                                           *SUBPROCESS_PYTEST_PLUGINS_OFF, timeout=60)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "test_hung.py::test_hung_while_a_task_retries did not finish within its timeout of 0.5 s: cancelled by "
        "the watchdog (tests/watchdog.py). Where each task was:",
    ])
    result.stdout.fnmatch_lines(["test_hung.py::test_swallows_the_cancel did not finish within its timeout of 0.5 s: "
                                 "cancelled by the watchdog (tests/watchdog.py) (it swallowed the cancel and "
                                 "returned). Where each task was:"])
    text = result.stdout.str()
    assert "in test_hung_while_a_task_retries" in text and "in retry_forever" in text, text
    assert "+ Timeout +" not in text, "pytest-timeout's last resort ended it, not the watchdog"

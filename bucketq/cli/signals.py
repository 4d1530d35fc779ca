"""SIGINT/SIGTERM as a graceful stop request for the long-running commands (watch, follow, worker)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def stop_on_signals(callback: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, callback)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)

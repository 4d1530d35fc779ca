"""A progress bar on stderr for large pushes: shown on a terminal once the input passes ``SHOW_AFTER`` lines."""

from __future__ import annotations

import sys
from typing import Any

SHOW_AFTER = 1000
UPDATE_EVERY = 256


class PushProgress:
    def __init__(self, enabled: bool | None, total_bytes: int | None) -> None:
        """``enabled``: True/False forces it; None shows it on a terminal for large inputs. ``total_bytes``
        (stdin is a regular file) gives a percentage; otherwise the bar pulses."""
        self._enabled = sys.stderr.isatty() if enabled is None else enabled
        self._show_after = SHOW_AFTER if enabled is None else 0
        self._total = total_bytes or None
        self._bar: Any = None
        self._task: Any = None

    def update(self, messages: int, consumed: int, *, force: bool = False) -> None:
        if not self._enabled or (messages % UPDATE_EVERY and not force):
            return
        if self._bar is None:
            if messages < self._show_after:
                return
            self._start()
        self._bar.update(self._task, completed=consumed if self._total else messages,
                         description=f"{messages:,} messages")

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("pushing {task.description}"), BarColumn(), TaskProgressColumn(),
                             TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task("", total=self._total)
        self._bar.start()

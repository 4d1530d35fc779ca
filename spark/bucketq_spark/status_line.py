"""A progress line for a person watching (the example jobs, ``make demo``): on a terminal one line rewritten in
place; elsewhere (a log file, a pipe) plain newline-ended lines, so that a log does not hold one long line of
carriage returns."""

from __future__ import annotations

import sys
import time
from typing import TextIO

CLEAR_LINE = "\r\033[K"  # back to the start of the line, and erase it: a shorter update leaves no tail


class StatusLine:
    """``show(text)`` rewrites the line on a terminal; elsewhere it prints ``text`` as a line of its own, at most
    one every ``every`` seconds (the last update held back is printed by ``end()``). ``end()`` closes the line;
    the same object may show another run of updates after it."""

    def __init__(self, stream: TextIO | None = None, *, every: float = 5.0) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.on_terminal = self.stream.isatty()
        self.every = every
        self._printed_at: float | None = None
        self._held: str | None = None
        self._open = False  # a terminal line is written and not ended yet

    def show(self, text: str) -> None:
        if self.on_terminal:
            self._write(CLEAR_LINE + text)
            self._open = True
            return
        now = time.monotonic()
        if self._printed_at is not None and now - self._printed_at < self.every:
            self._held = text
            return
        self._printed_at, self._held = now, None
        self._write(text + "\n")

    def end(self) -> None:
        if self._open:
            self._write("\n")
        elif self._held is not None:
            self._write(self._held + "\n")
        self._printed_at, self._held, self._open = None, None, False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

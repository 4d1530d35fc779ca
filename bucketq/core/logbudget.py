"""A budget of log lines per time window, so that a storm of failures cannot flood a log."""

from __future__ import annotations


class LogBudget:
    """At most ``limit`` lines per window of ``window_s`` seconds, the window starting at its first line; the
    lines past the limit are counted instead, for one summary line when the window closes. Times are
    monotonic seconds, passed in."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._started: float | None = None
        self._used = 0
        self._suppressed = 0

    def take(self, now: float) -> bool:
        """Whether one more line may be logged now; if not, it is counted as suppressed."""
        if self._started is None:
            self._started, self._used = now, 0
        if self._used < self.limit:
            self._used += 1
            return True
        self._suppressed += 1
        return False

    def close(self, now: float, *, force: bool = False) -> tuple[int, float] | None:
        """End the window once it has passed (at once with ``force``): ``(lines suppressed, seconds it
        lasted)`` when any were suppressed in it, else None."""
        if self._started is None or (not force and now - self._started < self.window_s):
            return None
        suppressed, lasted = self._suppressed, now - self._started
        self._started, self._used, self._suppressed = None, 0, 0
        return (suppressed, lasted) if suppressed else None

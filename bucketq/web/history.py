"""The last hour of each chart, sampled by the dashboard and kept in this process's memory: one
``(seconds since the epoch, value)`` pair per sample and series, at most ``span_s / interval_s`` of them. A
restart starts the charts afresh; nothing is written to MongoDB."""

from __future__ import annotations

import math
from collections import deque

Point = tuple[float, float]


class History:
    """Series by key (``("queue", "events", "pending")``), each a bounded deque of points."""

    def __init__(self, interval_s: float, span_s: float = 3600.0) -> None:
        self.interval_s = interval_s
        self.span_s = span_s
        self._size = math.ceil(span_s / interval_s) + 1
        self._series: dict[tuple[str, ...], deque[Point]] = {}

    def add(self, key: tuple[str, ...], at: float, value: float | None) -> None:
        """Record a sample; None (not measured) leaves a gap."""
        if value is None:
            return
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = deque(maxlen=self._size)
        series.append((at, float(value)))

    def points(self, key: tuple[str, ...], now: float) -> list[Point]:
        """The points of ``key`` within the span before ``now``, oldest first."""
        return [p for p in self._series.get(key, ()) if now - p[0] <= self.span_s]

    def forget(self, prefix: tuple[str, ...]) -> None:
        """Drop the series under ``prefix`` (a queue or stream that is gone)."""
        for key in [k for k in self._series if k[:len(prefix)] == prefix]:
            del self._series[key]

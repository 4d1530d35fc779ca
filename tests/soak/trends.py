"""Resource trends of a soak run (``<run>/resources.jsonl``): which series grow without bound, and a plot.

The rule: a series (one process's, or the server's, samples of one metric, by ``at``) *grows* when the mean of
its last quarter of samples exceeds the mean of its second quarter by more than ``MARGIN`` (20%) of it **and** by
more than the floor of its kind of metric (``FLOORS``: what a busy process may gain without leaking, e.g. 32 MB
of RSS, 50 asyncio tasks, 1,000 documents). The first quarter is left out: it is the warm-up (pools filling,
caches, imports). Document counts kept for a time (``docs.*``: tombstones, inbox entries, dead letters) warm up
longer: they level off only once their retention and a housekeeping round have passed (``settle_s``), so their
baseline is the quarter after that, and a run too short to hold it before its last quarter does not judge them. A
series of fewer than ``MIN_SAMPLES`` samples, and the test server's oplog (metrics ``server.oplog.*``, which grows
with every write by design), are reported but not judged.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

MARGIN = 0.20
MIN_SAMPLES = 8
NOT_JUDGED = ("server.oplog.",)  # metrics reported, never judged (by prefix)
SETTLING = ("docs.",)  # metrics that level off only after their retention (by prefix)
# Floors by the first of these parts found in the metric's name (its unit or what it counts); else DEFAULT_FLOOR.
FLOORS: tuple[tuple[str, float], ...] = (("_mb", 32.0), ("_bytes", 32.0 * 2**20), ("tasks", 50.0),
                                         ("connections", 10.0), ("cursors", 10.0), ("docs.", 1000.0),
                                         ("backlog", 1000.0))
DEFAULT_FLOOR = 1.0


@dataclass(frozen=True)
class Trend:
    """One series' verdict: the means of its second and last quarters, whether it was judged and grows."""

    proc: str
    metric: str
    samples: int
    second_quarter: float
    last_quarter: float
    judged: bool
    grows: bool

    def to_json(self) -> dict[str, Any]:
        """The trend as JSON."""
        return dict(vars(self))


def kind(metric: str) -> str:
    """The metric's kind, a panel of the plot: the first two parts of a server's or a document count's name
    (``server.oplog.count`` and ``server.oplog.size_mb`` are of kind ``server.oplog``, ``docs.jobs.tombstones``
    of kind ``docs.jobs``), else the name up to its first dot."""
    parts = metric.split(".")
    return ".".join(parts[:2]) if parts[0] in ("server", "docs") else parts[0]


def floor(metric: str) -> float:
    """The least growth of ``metric`` that can count as growing."""
    return next((f for part, f in FLOORS if part in metric), DEFAULT_FLOOR)


def series(samples: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """The samples per (process or server, metric), as (at, value) by ``at``."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for sample in samples:
        source = sample.get("proc", sample.get("server", "server"))
        found[(str(source), sample["metric"])].append((sample["at"], float(sample["value"])))
    return {key: sorted(points) for key, points in found.items()}


def trend(proc: str, metric: str, points: list[tuple[float, float]],
          not_judged: tuple[str, ...] = NOT_JUDGED, settle_s: float = 0.0) -> Trend:
    """The verdict on one series (the rule in the module's docstring); metrics starting with one of
    ``not_judged`` are reported only, and document counts are compared from ``settle_s`` after the first sample
    (``at`` in milliseconds) on."""
    values = [v for _, v in points]
    quarter = len(values) // 4
    if quarter == 0:
        return Trend(proc, metric, len(values), 0.0, 0.0, judged=False, grows=False)
    start = quarter
    if metric.startswith(SETTLING):
        start = max(start, next((i for i, (at, _) in enumerate(points) if at - points[0][0] >= settle_s * 1000),
                                len(values)))
    baseline_end = min(start + quarter, len(values))
    second = fmean(values[start:baseline_end]) if start < baseline_end else 0.0
    last = fmean(values[-quarter:])
    judged = (len(values) >= MIN_SAMPLES and not metric.startswith(not_judged)
              and baseline_end <= len(values) - quarter)
    grows = judged and last - second > max(MARGIN * abs(second), floor(metric))
    return Trend(proc, metric, len(values), second, last, judged, grows)


def trends(samples: Iterable[dict[str, Any]], not_judged: tuple[str, ...] = NOT_JUDGED,
           settle_s: float = 0.0) -> list[Trend]:
    """Every series' verdict."""
    return [trend(proc, metric, points, not_judged, settle_s)
            for (proc, metric), points in sorted(series(samples).items())]


def read_resources(run_dir: Path | str) -> list[dict[str, Any]]:
    """The samples of ``<run_dir>/resources.jsonl`` (a last line cut by a kill is left out)."""
    lines = (Path(run_dir) / "resources.jsonl").read_text().splitlines()
    samples = []
    for n, line in enumerate(lines):
        try:
            samples.append(json.loads(line))
        except json.JSONDecodeError:
            if n != len(lines) - 1:
                raise
    return samples


def check_trends(run_dir: Path | str, not_judged: tuple[str, ...] = NOT_JUDGED,
                 settle_s: float = 0.0) -> list[Trend]:
    """Every series' verdict for the run in ``run_dir``."""
    return trends(read_resources(run_dir), not_judged, settle_s)


def growing(found: Iterable[Trend]) -> list[Trend]:
    """The series judged to grow without bound."""
    return [t for t in found if t.grows]


def plot(run_dir: Path | str, png_path: Path | str) -> None:
    """Draw ``resources.jsonl`` into ``png_path``: one panel per metric kind, one line per process (and metric,
    where a kind has several), against minutes since the first sample, on one time axis."""
    from matplotlib.figure import Figure  # not pyplot: no display, no global figure state, half the import

    found = series(read_resources(run_dir))
    kinds = sorted({kind(metric) for _, metric in found})
    start = min((points[0][0] for points in found.values()), default=0.0)
    fig = Figure(figsize=(10, 2.2 * max(len(kinds), 1)))
    axes = fig.subplots(len(kinds) or 1, 1, squeeze=False, sharex=True)
    for ax, name in zip(axes[:, 0], kinds, strict=False):
        for (proc, metric), points in sorted(found.items()):
            if kind(metric) == name:
                label = proc if metric == name else metric if proc == "server" else f"{proc} {metric}"
                ax.plot([(at - start) / 60_000 for at, _ in points], [v for _, v in points], label=label)
        ax.set_title(name)
        ax.legend(fontsize="x-small", ncol=4)
    axes[-1, 0].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(png_path)

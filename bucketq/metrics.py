"""Counters and histograms of a queue, through OpenTelemetry when ``opentelemetry-api`` is installed
(``pip install bucketq[otel]``), else a no-op.

bucketq only records; the application chooses where metrics go by setting a ``MeterProvider`` (the SDK and
an exporter: OTLP, Prometheus, ...). Until it does, OpenTelemetry's API drops what is recorded. Every
instrument carries the attributes ``bucketq.queue`` and ``bucketq.database``.

Counters (``COUNTERS`` below): ``bucketq.pushed`` and ``bucketq.buckets.written`` (stored by producers),
``bucketq.consumed`` (handed to consumers), ``bucketq.acked``, ``bucketq.nacked`` (moved to a retry bucket),
``bucketq.dead`` and ``bucketq.quarantined`` (stored by consumers' flushes), ``bucketq.lease.lost`` (buckets
whose lease was lost). Histograms, in seconds: ``bucketq.push.latency`` (per bucket written, from its first push
to the end of its write: the longest wait of its pushes) and ``bucketq.handler.duration`` (per ``Worker``
handler call, one message or one batch).

Gauge: ``bucketq.pending`` (``{message}``), the autoscaling signal: the messages of the queue that need a worker
now (``pending_messages``: ready plus in flight), as the last ``Queue.stats()`` of this process counted them on the
server. Something must call ``stats()`` for it to move: the dashboard (``bucketq web``) does at every sample.

Counters cost an integer addition: they are observable counters over totals that OpenTelemetry reads when
it collects. Only ``consumed`` is counted per message; the rest once per bucket write, flush, quarantine or
handler call. The histograms are recorded through the SDK when one is set (several microseconds a record in
the Python SDK: once per bucket written, and once per handler call). Without OpenTelemetry every call is an
empty method.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bucketq.core.held import SlotState

if TYPE_CHECKING:
    from bucketq.core.accumulator import SealedBucket
    from bucketq.core.held import FlushPlan


class Metrics:
    """The instrumentation points. This base records nothing: it is what a queue uses without OpenTelemetry."""

    __slots__ = ()

    def written(self, buckets: Sequence[SealedBucket], failed: Mapping[Any, BaseException],
                now: Callable[[], dt.datetime]) -> None:
        """A producer's write of ``buckets`` ended; those in ``failed`` were not stored. ``now``: the server's time
        (the producer's ``ServerClock.now``), read only when a latency is recorded."""

    def consumed(self, n: int) -> None:
        """``n`` messages were handed to a consumer."""

    def flushed(self, plan: FlushPlan, applied: bool) -> None:
        """A consumer's flush plan was applied (its resolutions are stored) or refused (the lease was lost)."""

    def quarantined(self, n: int) -> None:
        """``n`` quarantine entries were written outside a flush plan (whole buckets)."""

    def handled(self, seconds: float) -> None:
        """A ``Worker`` handler call took ``seconds``."""


NOOP = Metrics()

# Counters are OpenTelemetry *observable* counters over plain totals kept here: counting is an integer
# addition, and OpenTelemetry reads the totals when it collects. (A synchronous SDK counter costs several
# microseconds a call: too much for a call per consumed message.) Totals are kept per queue for the life of
# the process, so they never go down when a ``Queue`` is closed and another opened on the same queue.
COUNTERS = {
    "pushed": ("bucketq.pushed", "{message}", "Messages stored by producers"),
    "buckets_written": ("bucketq.buckets.written", "{bucket}", "Buckets stored by producers"),
    "consumed": ("bucketq.consumed", "{message}", "Messages handed to consumers"),
    "acked": ("bucketq.acked", "{message}", "Acks stored"),
    "nacked": ("bucketq.nacked", "{message}", "Nacks stored (the message moved to a retry bucket)"),
    "dead": ("bucketq.dead", "{message}", "Messages moved to the dead letters"),
    "quarantined": ("bucketq.quarantined", "{entry}", "Quarantine entries written"),
    "lease_lost": ("bucketq.lease.lost", "{bucket}", "Buckets whose lease was lost"),
}


class _Totals:
    """Cumulative counts of one queue in this process, one per entry of ``COUNTERS``."""

    __slots__ = ("attributes", *COUNTERS)
    pushed: int
    buckets_written: int
    consumed: int
    acked: int
    nacked: int
    dead: int
    quarantined: int
    lease_lost: int

    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = attributes
        for name in COUNTERS:
            setattr(self, name, 0)


_TOTALS: dict[tuple[str, str], _Totals] = {}
_PENDING: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}  # (queue, database) -> (pending, attributes)


def pending_messages(stats: Mapping[str, Any]) -> int:
    """The messages of a queue that need a worker now, from its ``Queue.stats()``: ready (waiting for one) plus in
    flight (being handled: counting them keeps workers from being scaled away mid-message). Scheduled messages
    (delayed, or waiting out a retry's backoff) need none until they are due; dead letters and quarantined entries
    need an operator, not a worker. Messages, not documents: one bucket holds up to a thousand."""
    return int(stats["ready"]) + int(stats["in_flight"])


def record_pending(queue: str, database: str, stats: Mapping[str, Any]) -> int:
    """Note the queue's ``pending_messages`` for the ``bucketq.pending`` gauge, and return it."""
    pending = pending_messages(stats)
    _PENDING[queue, database] = (pending, {"bucketq.queue": queue, "bucketq.database": database})
    _instruments()  # registers the gauge, once
    return pending


@dataclass(frozen=True)
class _Histograms:
    push_latency: Any
    handler_duration: Any


@functools.cache
def _instruments() -> _Histograms | None:
    """Register the instruments once per process on OpenTelemetry's global meter (a proxy until the application
    sets a provider, so a provider set later still gets them); None without ``opentelemetry-api``."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    meter = metrics.get_meter("bucketq", _version())
    for field, (name, unit, description) in COUNTERS.items():
        meter.create_observable_counter(name, callbacks=[_observer(field, metrics.Observation)], unit=unit,
                                        description=description)
    meter.create_observable_gauge("bucketq.pending", callbacks=[_observe_pending(metrics.Observation)],
                                  unit="{message}", description="Messages that need a worker now (ready + in flight)")
    return _Histograms(
        push_latency=meter.create_histogram("bucketq.push.latency", unit="s",
                                            description="Per bucket written: from its first push to its write's end"),
        handler_duration=meter.create_histogram("bucketq.handler.duration", unit="s",
                                                description="Worker handler call time"),
    )


def _observer(field: str, observation: Any) -> Any:
    def observe(options: Any) -> list[Any]:
        return [observation(getattr(t, field), t.attributes) for t in list(_TOTALS.values())]
    return observe


def _observe_pending(observation: Any) -> Any:
    def observe(options: Any) -> list[Any]:
        return [observation(value, attributes) for value, attributes in list(_PENDING.values())]
    return observe


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bucketq")
    except PackageNotFoundError:
        return "0"


class OtelMetrics(Metrics):
    """Adds to the queue's totals (read by OpenTelemetry's observable counters) and records the histograms."""

    __slots__ = ("_h", "_t")

    def __init__(self, histograms: _Histograms, totals: _Totals) -> None:
        self._h = histograms
        self._t = totals

    def written(self, buckets: Sequence[SealedBucket], failed: Mapping[Any, BaseException],
                now: Callable[[], dt.datetime]) -> None:
        stored = [b.document for b in buckets if b.id not in failed]
        if not stored:
            return
        at = now()
        self._t.buckets_written += len(stored)
        self._t.pushed += sum(doc["n"] for doc in stored)
        for doc in stored:
            self._h.push_latency.record(max(0.0, (at - doc["created"]).total_seconds()), self._t.attributes)

    def consumed(self, n: int) -> None:
        self._t.consumed += n

    def flushed(self, plan: FlushPlan, applied: bool) -> None:
        totals = self._t
        if not applied:
            totals.lease_lost += 1
            return
        # Counted in C: a plan holds a state a message. Not by a Counter, which would call the enum's __hash__, a
        # Python function, for each.
        states = list(plan.slots.values())
        totals.acked += states.count(SlotState.ACKED)
        totals.nacked += states.count(SlotState.RETRY)
        totals.dead += states.count(SlotState.DEAD)
        totals.quarantined += states.count(SlotState.QUARANTINED)

    def quarantined(self, n: int) -> None:
        self._t.quarantined += n

    def handled(self, seconds: float) -> None:
        self._h.handler_duration.record(seconds, self._t.attributes)


def for_queue(queue: str, database: str) -> Metrics:
    """The metrics of queue ``queue`` in ``database``: OpenTelemetry's when its API is installed, else ``NOOP``."""
    histograms = _instruments()
    if histograms is None:
        return NOOP
    totals = _TOTALS.get((queue, database))
    if totals is None:
        totals = _TOTALS[queue, database] = _Totals({"bucketq.queue": queue, "bucketq.database": database})
    return OtelMetrics(histograms, totals)

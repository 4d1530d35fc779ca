"""The worker side of the bench protocol, for the Python contenders (bench/keuss/driver.js speaks it too).

A worker is one process running one contender in one role (fill, push, consume, end_to_end, encode,
decode). It gets its spec as JSON in argv[1], sets up (connects, pre-builds data), prints
``{"ready": true}``, waits for ``go`` on stdin, runs the timed phase while printing ``{"progress": n}``
lines, and ends with one ``{"result": {...}}`` line. Its CPU time and peak RSS are its own.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from pymongo import monitoring

PROGRESS_EVERY_S = 0.25
# A consumer's clock stops at its last ack, between two readings of the CPU: what it spent up to then is
# interpolated, as if spent evenly up to the next reading, while the consumer idles after its last ack. With a
# reading every progress tick, that left out up to 0.06 s (a sixth of a 60,000-message consume's CPU).
CPU_SAMPLE_EVERY_S = 0.01
MAX_LATENCY_SAMPLES = 20_000


class CommandCounter(monitoring.CommandListener):
    """Records (time, name) of every command a client starts while ``active`` (pymongo command monitoring)."""

    def __init__(self) -> None:
        self.active = False
        self.events: list[tuple[float, str]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.active:
            self.events.append((time.time(), event.command_name))  # list.append is atomic under the GIL

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def within(self, windows: list[tuple[float, float]]) -> Counter[str]:
        return Counter(name for t, name in self.events if any(a <= t <= b for a, b in windows))


def payload(i: int, pad: str) -> dict:
    """One message: its send time (for push→handler latency), a sequence number, padding to size."""
    return {"ts": time.time(), "i": i, "pad": pad}


def split(total: int, parts: int) -> list[int]:
    """total as parts near-equal shares."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def write_concern(spec: dict) -> int | str:
    wc = spec.get("write_concern", "1")
    return int(wc) if wc.isdigit() else wc


def run_threads(fns: list[Callable[[], None]]) -> None:
    """Run each fn in a thread of its own, join all, re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(fn,), daemon=True) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def interpolate(samples: list[tuple[float, float]], t: float) -> float:
    """The value at time t, linearly between the (time, value) samples around it."""
    before = max((s for s in samples if s[0] <= t), default=samples[0])
    after = min((s for s in samples if s[0] >= t), default=samples[-1])
    if after[0] <= before[0]:
        return before[1]
    return before[1] + (after[1] - before[1]) * (t - before[0]) / (after[0] - before[0])


class Ctx:
    """What a contender's role function gets: the spec, the clock, the counters."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.pad = "x" * spec.get("pad_len", 0)
        self.commands = CommandCounter()
        self.latencies_ms: list[float] = []
        self.notes: list[str] = []
        self.extra: dict = {}  # more of the result, a role's own (the idle scenario's counts)
        self.count = 0
        self._lock = threading.Lock()  # count and _t_last, marked from several threads
        self._out = threading.Lock()  # stdout lines, written from the progress thread too
        self._t0 = self._t_end = self._t_last = 0.0
        self._cpu = 0.0
        self._cpu_samples: list[tuple[float, float]] = []  # (time, CPU seconds), every CPU_SAMPLE_EVERY_S
        self._windows: list[tuple[float, float]] = []  # the timed spans: commands count within them
        self._stopped = threading.Event()

    def emit(self, obj: dict) -> None:
        with self._out:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    def go(self) -> None:
        """Announce readiness, block until the orchestrator says go, then start the clock."""
        self.emit({"ready": True})
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("orchestrator went away before go")
        self.commands.active = True
        self._t0 = self._t_last = time.time()
        self._cpu_samples.append((self._t0, _cpu_s()))
        threading.Thread(target=self._progress, daemon=True).start()

    def mark(self, n: int = 1) -> None:
        """n more messages completed (durably pushed, or acked), from any thread."""
        with self._lock:
            self.mark_in_loop(n)

    def mark_in_loop(self, n: int = 1) -> None:
        """``mark`` for a role whose marks all come from one thread (an event loop's): without the lock, which
        cost a consumer a third of a microsecond a message that the floor, marking once a bucket, does not pay."""
        self.count += n
        self._t_last = time.time()

    def latency(self, sent_ts: float) -> None:
        self.latencies_ms.append((time.time() - sent_ts) * 1000.0)

    def sample(self, started: float) -> None:
        """One more message done, ``started`` (a ``time.perf_counter()`` reading) ago: its latency is kept."""
        self.latencies_ms.append((time.perf_counter() - started) * 1000.0)
        self.mark()

    def stop(self, at_last_mark: bool = False) -> None:
        """Stop the clock now, or, for consumers that ended on an idle timeout, at the last completed
        message (so the idle wait and its polling count neither as time, nor as commands, nor as CPU)."""
        now, cpu = time.time(), _cpu_s()
        self._t_end = self._t_last if at_last_mark else now
        self._cpu = interpolate([*self._cpu_samples, (now, cpu)], self._t_end) - self._cpu_samples[0][1]
        self._windows.append((self._t0, self._t_end))
        self._stopped.set()

    @contextlib.contextmanager
    def tail(self) -> Iterator[None]:
        """Work after stop() that still counts (a final drain/flush): its time and commands are added."""
        t, cpu = time.time(), _cpu_s()
        yield
        self._windows.append((t, time.time()))
        self._t_end += time.time() - t
        self._cpu += _cpu_s() - cpu

    def result(self) -> dict:
        if not self._stopped.is_set():
            self.stop()
        names = self.commands.within(self._windows)
        counted = self.spec.get("counts_commands", True)
        lat = self.latencies_ms
        if len(lat) > MAX_LATENCY_SAMPLES:
            step = len(lat) / MAX_LATENCY_SAMPLES
            lat = [lat[int(k * step)] for k in range(MAX_LATENCY_SAMPLES)]
        return {
            "messages": self.count,
            "t_start": self._t0,
            "t_end": self._t_end,
            "cpu_s": self._cpu,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "commands": sum(names.values()) if counted else None,
            "command_names": dict(names) if counted else None,
            "latencies_ms": lat,
            "notes": "; ".join(self.notes),
            **self.extra,
        }

    def _progress(self) -> None:
        per_progress = round(PROGRESS_EVERY_S / CPU_SAMPLE_EVERY_S)
        samples = 0
        while not self._stopped.wait(CPU_SAMPLE_EVERY_S):
            self._cpu_samples.append((time.time(), _cpu_s()))
            samples += 1
            if samples % per_progress == 0:
                self.emit({"progress": self.count})


def main(roles: dict[str, Callable[[Ctx], None]]) -> None:
    """Entry point of a Python contender module: run the role named in the spec, report one result."""
    ctx = Ctx(json.loads(sys.argv[1]))
    try:
        role = roles.get(ctx.spec["role"])
        if role is None:
            raise ValueError(f"this contender has no role {ctx.spec['role']!r}")
        role(ctx)
        ctx.emit({"result": ctx.result()})
    except BaseException as exc:  # report, whatever it was, so the orchestrator never waits blind
        traceback.print_exc()
        frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
        ctx.emit({"result": {"error": f"{type(exc).__name__}: {exc}{where}"}})
        sys.exit(1)

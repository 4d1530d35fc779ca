"""``make test``'s tiers, run side by side, each reporting on its own: ``python -m devtools.tiers [NAME ...]``.

A tier is lint (with the strict docs build), or one pytest run on one Python: on each, the tests that need no
server (``-m unit``) on two xdist workers; on the main venv's 3.11 the Spark tests, and the rest (the browser test
too), each on one process; on 3.12 and 3.13 (devtools/pythons.py: their venvs) all the rest but Spark's and the
browser's, on one process. So 3.11 runs the whole suite, in three parts. Every tier runs, whatever another's
outcome; at the end one line each gives its result (pytest's closing line), then a last plain line the sum, and the
command fails if any tier failed. Names given on the command line pick the tiers whose name starts with one of them
(``3.12 3.13``: make test-pythons).

Lanes run at once, each its tiers in turn: the tiers that mostly wait for the test server, Spark and subprocesses
(the server and Spark tiers, a load near one or below each) side by side, while one lane runs the CPU-bound ones
(lint, the unit tiers) in turn. Each pytest session starts a test server of its own (tests/conftest.py, on a free
port; its log is named by the port), unless ``BUCKETQ_MONGODB_URI`` is set; each version caches its bytecode under
a folder of its own. A tier's output goes to ``.cache/tiers/<name>.log`` and is printed whole when it ends, so that
lanes never interleave; a progress line comes every minute meanwhile.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from devtools.pythons import ensure_venv, find_interpreter

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "tiers"
MAIN_VERSION = "3.11"  # the main venv's (.venv)
# tests/conftest.py marks "unit" the tests that need no server, no JVM and are not slow; the other versions' venvs
# have no pyspark, and the browser test runs once, on 3.11
SERVER_MARKS = "not unit and not spark and not browser"
PROGRESS_EVERY_S = 60.0


@dataclass(frozen=True)
class Tier:
    """One run: lint (``version`` None), or pytest on ``version``'s venv with ``marks`` (None: every test)."""

    name: str
    version: str | None
    marks: str | None = None
    workers: int = 0  # pytest-xdist workers; 0: one process
    lane: int = 0  # tiers of one lane run in turn, lanes at once

    @property
    def log(self) -> Path:
        return LOGS / f"{self.name.replace(' ', '-')}.log"


CPU_LANE = 0
TIERS = (
    Tier("lint", None, lane=CPU_LANE),
    Tier("3.11 unit", MAIN_VERSION, "unit", workers=2, lane=CPU_LANE),
    Tier("3.12 unit", "3.12", "unit", workers=2, lane=CPU_LANE),
    Tier("3.13 unit", "3.13", "unit", workers=2, lane=CPU_LANE),
    Tier("3.11 spark", MAIN_VERSION, "spark", lane=1),
    Tier("3.11 server", MAIN_VERSION, "not unit and not spark", lane=2),  # the browser test too
    Tier("3.12 server", "3.12", SERVER_MARKS, lane=3),
    Tier("3.13 server", "3.13", SERVER_MARKS, lane=4),
)


def selection(version: str) -> str | None:
    """The ``-m`` expression of every test that ``version``'s tiers run together (None: the whole suite)."""
    marks = [tier.marks for tier in TIERS if tier.version == version]
    if not marks or None in marks:
        return None
    return " or ".join(f"({m})" for m in marks)


def python_of(version: str) -> Path:
    """The interpreter of ``version``'s venv: the main one for 3.11, else one under .cache/venvs (made if need be)."""
    if version == MAIN_VERSION:
        return ROOT / ".venv" / "bin" / "python"
    interpreter = find_interpreter(version)
    if interpreter is None:
        raise RuntimeError(f"python {version}: no interpreter found (python{version} on PATH or in pyenv)")
    return ensure_venv(version, interpreter)


def pytest_command(python: str | Path, version: str) -> list[str]:
    """pytest on ``version``'s interpreter ``python``, the plugins every tier of that version runs with."""
    # anyio's pytest plugin is of no use here (asyncio_mode=auto); the other venvs' runs have left it out
    return [str(python), "-m", "pytest", "-p", "no:cacheprovider", *(["-p", "no:anyio"] if version != MAIN_VERSION
                                                                     else [])]


@dataclass
class Outcome:
    """How a tier ended, read from its exit status and pytest's closing line."""

    tier: Tier
    returncode: int | None = None  # None: not run (interrupted first)
    seconds: float = 0.0
    closing: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    def line(self) -> str:
        state = ("PASSED" if self.passed else "not run" if self.returncode is None
                 else f"FAILED (exit {self.returncode})")
        return f"{self.tier.name:<12} {state:<18} {self.seconds:5.0f} s  {self.closing}"


# pytest's closing line, in -q form ("12 passed, 1 skipped in 3.40s") or framed by "=" signs
CLOSING = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b.* in [\d.]+s.*?)"
                     r"\s*=*$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")
PERCENT = re.compile(r"\[\s*(\d+)%\]")


def closing_line(text: str) -> tuple[str, dict[str, int]]:
    """pytest's last closing line in ``text`` and its passed, failed and error counts."""
    lines = [m.group(1) for line in text.splitlines() if (m := CLOSING.match(line.strip()))]
    if not lines:
        return "", {}
    counts: dict[str, int] = {}
    for n, what in COUNT.findall(lines[-1]):
        key = "error" if what.startswith("error") else what
        counts[key] = counts.get(key, 0) + int(n)
    return lines[-1], counts


class Runner:
    """Runs the lanes, prints each tier's log as it ends and a progress line meanwhile."""

    def __init__(self, tiers: list[Tier], pytest_args: list[str]) -> None:
        self.tiers = tiers
        self.pytest_args = pytest_args
        self.outcomes = {tier.name: Outcome(tier) for tier in tiers}
        self.started: dict[str, float] = {}
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.venvs: dict[str, Path | Exception] = {}
        self.installers: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()
        self.stopping = False

    def command(self, tier: Tier) -> list[str]:
        if tier.version is None:
            return ["make", "--no-print-directory", "lint", "docs"]  # the docs build is CPU-bound too
        python = self.venvs[tier.version]
        if isinstance(python, Exception):
            raise python
        args = [*pytest_command(python, tier.version), "-q", "--durations=15"]
        if tier.marks is not None:
            args += ["-m", tier.marks]
        if tier.workers:
            args += ["-n", str(tier.workers)]
        return args + self.pytest_args

    def environment(self, tier: Tier) -> dict[str, str]:
        # Bytecode is cached (under a prefix, per version) even where PYTHONDONTWRITEBYTECODE is set: each of the
        # tests' CLI, worker and stress processes otherwise compiles bucketq.
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        cache = ROOT / ".cache" / "pycache"
        env["PYTHONPYCACHEPREFIX"] = str(cache if tier.version in (None, MAIN_VERSION) else cache / tier.version)
        return env

    def run_tier(self, tier: Tier) -> None:
        outcome = self.outcomes[tier.name]
        started = time.monotonic()
        with self.lock:
            if self.stopping:
                return
            self.started[tier.name] = started
        with tier.log.open("wb") as log:
            try:
                command = self.command(tier)
            except Exception as exc:  # no interpreter, or its venv did not install
                log.write(f"{tier.name}: {exc}\n".encode())
                outcome.returncode = 1
            else:
                log.write(f"$ {shlex.join(command)}\n".encode())
                log.flush()
                with self.lock:
                    if self.stopping:
                        return
                    # a session of its own: a Ctrl-C reaches this runner only, which passes one on (stop)
                    process = subprocess.Popen(command, cwd=ROOT, env=self.environment(tier), stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
                    self.running[tier.name] = process
                outcome.returncode = process.wait()
                with self.lock:
                    del self.running[tier.name]
        outcome.seconds = time.monotonic() - started
        text = tier.log.read_text(errors="replace")
        outcome.closing, outcome.counts = closing_line(text)
        if not outcome.closing:  # lint, or a run that ended before pytest's summary: its last line says why
            outcome.closing = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")[:100]
        with self.lock:
            print(f"\n======== {tier.name}: {'passed' if outcome.passed else 'FAILED'} after {outcome.seconds:.0f} s "
                  f"(log: {tier.log.relative_to(ROOT)}) ========", flush=True)
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            print(f"======== end of {tier.name} ========", flush=True)

    def run_lane(self, lane: list[Tier]) -> None:
        for tier in lane:
            if tier.version is not None:
                self.installers[tier.version].join()
            self.run_tier(tier)

    def make_venv(self, version: str) -> None:
        try:
            self.venvs[version] = python_of(version)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            self.venvs[version] = exc

    def progress(self) -> str:
        now = time.monotonic()
        parts = []
        for tier in self.tiers:
            outcome = self.outcomes[tier.name]
            if outcome.returncode is not None:
                parts.append(f"{tier.name} {'passed' if outcome.passed else 'FAILED'}")
            elif tier.name in self.started:
                seen = PERCENT.findall(tier.log.read_text(errors="replace")) if tier.log.exists() else []
                done = f" {seen[-1]}%" if seen else ""
                parts.append(f"{tier.name}{done} {now - self.started[tier.name]:.0f} s")
            else:
                parts.append(f"{tier.name} waiting")
        return "tiers: " + ", ".join(parts)

    def run(self) -> list[Outcome]:
        LOGS.mkdir(parents=True, exist_ok=True)
        # Each version's venv installs in a thread of its own, at once; a lane waits for it before its tier.
        for version in sorted({t.version for t in self.tiers if t.version is not None}):
            self.installers[version] = threading.Thread(target=self.make_venv, args=(version,), daemon=True)
            self.installers[version].start()
        lanes: dict[int, list[Tier]] = {}
        for tier in self.tiers:
            lanes.setdefault(tier.lane, []).append(tier)
        threads = [threading.Thread(target=self.run_lane, args=(lane,), daemon=True) for lane in lanes.values()]
        begun = time.monotonic()
        print(f"tiers: {', '.join(t.name for t in self.tiers)}; {len(threads)} at a time at most; logs in "
              f"{LOGS.relative_to(ROOT)}", flush=True)
        for thread in threads:
            thread.start()
        try:
            next_progress = begun + PROGRESS_EVERY_S
            while any(thread.is_alive() for thread in threads):
                time.sleep(0.5)
                if time.monotonic() >= next_progress:
                    next_progress += PROGRESS_EVERY_S
                    with self.lock:
                        print(f"{self.progress()} ({time.monotonic() - begun:.0f} s in all)", flush=True)
        except KeyboardInterrupt:
            print("tiers: interrupted; stopping the running tiers", flush=True)
            self.stop()
            for thread in threads:
                thread.join()
        print(f"tiers: {time.monotonic() - begun:.0f} s in all", flush=True)
        return [self.outcomes[tier.name] for tier in self.tiers]

    def stop(self) -> None:
        """Interrupt every running tier (as a Ctrl-C would: pytest stops its test server) and start no other."""
        with self.lock:
            self.stopping = True
            for process in self.running.values():
                try:
                    process.send_signal(signal.SIGINT)
                except ProcessLookupError:
                    pass


def report(outcomes: list[Outcome]) -> bool:
    """Print one line a tier, then the sums; whether every tier passed. A tier that failed without a failed test
    (lint, a collection error, a crash) counts as one failure, so that the last line never hides it."""
    print("\n======== tiers ========")
    for outcome in outcomes:
        print(outcome.line())
    passed = sum(o.counts.get("passed", 0) for o in outcomes)
    failed = sum(max(o.counts.get("failed", 0) + o.counts.get("error", 0), 0 if o.passed else 1) for o in outcomes)
    print(f"{passed} passed, {failed} failed", flush=True)
    return all(o.passed for o in outcomes)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.tiers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="run only the tiers whose name starts with one of these")
    parser.add_argument("--pytest-args", default="", help="more arguments for every pytest tier (one string)")
    args = parser.parse_args(argv)
    tiers = [t for t in TIERS if not args.names or any(t.name.startswith(n) for n in args.names)]
    if not tiers:
        parser.error(f"no tier is named {' or '.join(args.names)}: {', '.join(t.name for t in TIERS)}")
    signal.signal(signal.SIGTERM, _interrupt)
    return 0 if report(Runner(tiers, shlex.split(args.pytest_args)).run()) else 1


if __name__ == "__main__":
    sys.exit(main())

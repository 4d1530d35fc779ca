"""Where a consumed message's CPU goes, library by library and function by function, beside the floor's:
what ``bench.profiling.consume_cpu`` splits into user, system and collector time, split by ``perf``'s samples instead.

For each consumer (the floor, ``reserve`` + ``ack``, ``reserve_many(100)`` + ``ack_many``) and each of two queue
sizes: fill a queue with 1 KiB messages (untimed), then run ``bench.profiling.consume_cpu``'s child, which consumes
all of it and reports its user and system CPU seconds, under ``perf record -F 10000``. The smaller run is subtracted
from the larger, library (DSO) by library and symbol by symbol, so that start-up and imports cancel out; each one's
share of the samples is then applied to the child's own CPU seconds (its ``getrusage``, which perf's sampling rate
does not skew) and turned into µs a message. Prints each library's share, then the symbols whose share a bucketq
consumer exceeds the floor's by most. Needs ``perf`` (``linux-perf``) and leave to use it (root, or
``kernel.perf_event_paranoid`` at most 1).

    python -m bench.profiling.consume_perf [--messages 16384,81920] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from bench.profiling.consume_cpu import MODES
from bench.profiling.consume_instructions import fill

# "  12.34%   567  libpython3.11.so.1.0  [.] _PyEval_EvalFrameDefault" (perf report -n --sort dso,sym)
_ROW = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[[.k]\]\s+(.+?)\s*$")


class Run(NamedTuple):
    samples: collections.Counter[tuple[str, str]]  # by (library, symbol), start-up included
    cpu_s: float  # the child's user and system CPU seconds consuming (its own getrusage)
    messages: int


def sampled(uri: str, queue: str, batch: int, ack_many: bool) -> Run:
    """A child process consuming ``queue`` under ``perf record``."""
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "perf.data")
        child = subprocess.run(["perf", "record", "-q", "-F", "10000", "-o", data, "--", sys.executable, "-m",
                                "bench.profiling.consume_cpu", "--child", uri, queue, str(batch),
                                "1" if ack_many else "0"],
                               capture_output=True, text=True, check=True)
        report = subprocess.run(["perf", "report", "-i", data, "--stdio", "-n", "--sort", "dso,sym"],
                                capture_output=True, text=True, check=True).stdout
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in report.splitlines():
        if (row := _ROW.match(line)) is not None:
            counts[row.group(2), row.group(3)] += int(row.group(1))
    measured = json.loads(child.stdout.splitlines()[-1])
    return Run(counts, measured["user"] + measured["system"], measured["n"])


def per_message_us(small: Run, large: Run) -> dict[tuple[str, str], float]:
    """µs a message of each (library, symbol): its share of the samples the larger run has beyond the smaller, of
    the CPU seconds the larger run spent beyond the smaller."""
    keys = large.samples.keys() | small.samples.keys()
    extra = {key: large.samples[key] - small.samples[key] for key in keys}
    us_a_sample = 1e6 * (large.cpu_s - small.cpu_s) / sum(extra.values()) / (large.messages - small.messages)
    return {key: n * us_a_sample for key, n in extra.items()}


def by_library(figures: dict[tuple[str, str], float]) -> dict[str, float]:
    libraries: dict[str, float] = collections.defaultdict(float)
    for (library, _), us in figures.items():
        libraries[library] += us
    return libraries


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", default="16384,81920", help="the two queue sizes, smaller first")
    parser.add_argument("--top", type=int, default=25, help="symbols to list for each bucketq consumer")
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: apt install linux-perf)")
    from bench.server import server

    small_n, large_n = (int(n) for n in args.messages.split(","))
    figures: dict[str, dict[tuple[str, str], float]] = {}
    with server() as srv:
        srv.drop_bench_db()
        for mode, (batch, ack_many) in MODES.items():
            runs = []
            for n in (small_n, large_n):
                queue = f"perf_{batch}_{n}"
                asyncio.run(fill(srv.uri, queue, n))
                runs.append(sampled(srv.uri, queue, batch, ack_many))
            figures[mode] = per_message_us(*runs)
            print(f"{mode}: {sum(figures[mode].values()):.2f} µs a message", flush=True)
        srv.drop_bench_db()
    floor = figures["floor"]
    libraries = {mode: by_library(mode_figures) for mode, mode_figures in figures.items()}
    print(f"\nµs a message by library ({large_n:,} minus {small_n:,} messages; libraries under 0.05 µs left out):")
    print(f"  {'library':45s}" + "".join(f"{mode:>30s}" for mode in figures))
    for library in sorted(set().union(*libraries.values())):
        row = [libraries[mode].get(library, 0.0) for mode in figures]
        if max(abs(us) for us in row) >= 0.05:
            print(f"  {library[:45]:45s}" + "".join(f"{us:30.2f}" for us in row))
    for mode in list(figures)[1:]:
        print(f"\n{mode}: the {args.top} symbols it spends most on beyond the floor, µs a message "
              "(its own; the floor's):")
        extra = sorted(figures[mode], key=lambda key: floor.get(key, 0.0) - figures[mode][key])
        for library, symbol in extra[:args.top]:
            own, base = figures[mode][library, symbol], floor.get((library, symbol), 0.0)
            print(f"  {own - base:+6.2f}  ({own:5.2f}; {base:5.2f})  {symbol[:60]}  [{library[:30]}]")


if __name__ == "__main__":
    main()

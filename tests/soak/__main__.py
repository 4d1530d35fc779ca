"""``python -m tests.soak --minutes M [--seed S] [--keep-results]``: the soak run (``tests/soak/runner.py``). The
seed is printed first (stdout), progress goes to stderr, and the closing report is the last line of stdout (one
JSON object); the exit status is 1 on any rule violation, growing resource trend or process error."""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys

from tests.soak.runner import RESULTS, run


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the runner's cleanup (processes, server, temp dir)


def main(argv: list[str] | None = None) -> int:
    """Run the soak once; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long faults are injected (then the drain)")
    parser.add_argument("--seed", type=int, help="replays a run's fault schedule (default: a random one)")
    parser.add_argument("--keep-results", action="store_true", help=f"keep the run directory in {RESULTS}/<seed>/")
    args = parser.parse_args(argv)
    if args.minutes <= 0.5:
        parser.error("--minutes must be more than half a minute (warm-up and quiet end)")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    print(f"seed {seed}", flush=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        report = run(seed, args.minutes, args.keep_results)
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM: the processes, the server and the temp dirs are gone
        print(f"soak: interrupted ({exc or 'SIGINT'}); seed {seed}", file=sys.stderr)
        return 130
    for failure in report.get("failures", []):
        print(f"soak: FAILED: {failure}", file=sys.stderr)
    print(json.dumps(report, default=str), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m tests.stress [--quick] [flags]``: run the stress harness, print a JSON report as the last line
of stdout (progress goes to stderr), exit 1 when anything was lost or unexpected, or when duplicates
exceed what the design allows (see ``tests/stress/__init__.py``).

Knobs, as flags or environment variables (flags win): WRITERS, MESSAGES_PER_WRITER, CONSUMERS, CRASHERS,
PAYLOAD_BYTES, SERVER_RESTARTS, DEDUPE (on|off|both, or 1|0), and STRESS_SEED, WRITER_KILLS, PROXY_CUTS,
LOST_INSERTS, LOST_FENCED, DELAYED_RETRIES, CLOCK_STEPS, GROUPS (ordered groups per writer; 0: none).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import fields

from tests.stress.harness import Config, run

# The quick run (the dataclass defaults, both dedupe modes): about two minutes on two shared cores. Both,
# because each mode sees what the other cannot: without dedupe (and keys) a bucket stored again or an ack
# that was not kept is delivered twice; with dedupe the keyed ack path (the inbox) is exercised.
QUICK = Config(dedupe="both")
# The full run: both dedupe modes, three times the messages and more of every fault; about ten minutes.
FULL = Config(writers=6, messages_per_writer=5_000, consumers=6, crashers=3, payload_bytes=500, server_restarts=3,
              dedupe="both", writer_kills=6, cuts=10, lost_inserts=6, lost_fenced=6, delayed_retries=6,
              clock_steps=4, write_seconds=150.0, timeout_s=3600.0)
# flag / environment variable -> Config field
KNOBS = {
    "writers": "WRITERS", "messages_per_writer": "MESSAGES_PER_WRITER", "consumers": "CONSUMERS",
    "crashers": "CRASHERS", "payload_bytes": "PAYLOAD_BYTES", "server_restarts": "SERVER_RESTARTS",
    "dedupe": "DEDUPE", "seed": "STRESS_SEED", "writer_kills": "WRITER_KILLS", "cuts": "PROXY_CUTS",
    "lost_inserts": "LOST_INSERTS", "lost_fenced": "LOST_FENCED", "delayed_retries": "DELAYED_RETRIES",
    "clock_steps": "CLOCK_STEPS", "groups": "GROUPS",
}


def dedupe_mode(value: str) -> str:
    v = value.strip().lower()
    for mode, spellings in {"on": ("on", "1", "true", "yes"), "off": ("off", "0", "false", "no"),
                            "both": ("both",)}.items():
        if v in spellings:
            return mode
    raise argparse.ArgumentTypeError(f"DEDUPE must be on, off or both, got {value!r}")


def parse(argv: list[str]) -> Config:
    parser = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small run of `make stress-quick`")
    for name, env in KNOBS.items():
        kind = dedupe_mode if name == "dedupe" else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"(env {env})")
    parser.add_argument("--batch", type=int, help="messages a consumer handles per batch")
    parser.add_argument("--write-seconds", type=float, help="spread each writer's pushes over this many seconds "
                        "(0: as fast as possible)")
    parser.add_argument("--timeout", type=float, help="seconds before the run is abandoned")
    parser.add_argument("--keep", action="store_true", help="keep the logs and the database for a post-mortem")
    parser.add_argument("--no-streams", action="store_true", help="skip the stream run (tests/stress/streams.py)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    values = {f.name: getattr(base, f.name) for f in fields(Config)}
    for name, env in KNOBS.items():
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
        elif os.environ.get(env, "").strip():
            try:
                values[name] = dedupe_mode(os.environ[env]) if name == "dedupe" else int(os.environ[env])
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{env}={os.environ[env]!r}: {exc}")
    if args.batch is not None:
        values["batch"] = args.batch
    if args.write_seconds is not None:
        values["write_seconds"] = args.write_seconds
    if args.timeout is not None:
        values["timeout_s"] = args.timeout
    values["keep"] = args.keep
    values["streams"] = not args.no_streams
    config = Config(**values)
    if min(config.writers, config.messages_per_writer, config.consumers) < 1 or config.crashers < 0:
        parser.error("writers, messages per writer and consumers must be at least 1, crashers at least 0")
    return config


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the harness's cleanup (processes, server)


def main(argv: list[str] | None = None) -> int:
    config = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    report = run(config)
    report["wall_s"] = round(time.monotonic() - started, 1)
    if report["failures"]:
        for failure in report["failures"]:
            print(f"stress: FAILED: {failure}", file=sys.stderr)
    print(json.dumps(report, default=str), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

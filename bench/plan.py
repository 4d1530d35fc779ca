"""What to run: settings (full or --quick, overridable) and the list of jobs they make."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.contenders import ALL, SCENARIOS

MAIN_SCENARIOS = ("push", "push_many", "consume", "consume_batch", "end_to_end", "stream_push")
ALL_SCENARIOS = (*MAIN_SCENARIOS, "latency", "idle", "codec", "majority", "spark")
LATENCY_MESSAGES = 1000  # sequential awaited pushes of the latency scenario
IDLE_BACKLOG = 20_000  # messages the idle consumers consume before their idle window
IDLE_SCENARIOS = ("idle", "stream_idle")  # the idle scenario's cells: queue consumers, stream readers
JSON_OVERHEAD = 45  # bytes of {"ts":1763837000.123456,"i":123456,"pad":""} around the padding


@dataclass(frozen=True)
class Settings:
    quick: bool
    warmup: bool
    rounds: int  # each cell's jobs run this many times, interleaved; the median round is reported
    contenders: tuple[str, ...]
    scenarios: tuple[str, ...]
    payloads: tuple[int, ...]
    processes: tuple[int, ...]
    e2e_processes: tuple[int, ...]
    messages: int  # per job for bucketq, keuss and floor
    naive_messages: int
    codec_messages: int
    byte_budget: int  # caps messages x payload per job (the test server keeps everything in memory)
    concurrency: int  # consumer tasks/threads per process (and naive producer threads)
    window: int  # un-acknowledged pushes per process (bucketq, keuss, floor)
    idle_s: float  # a consumer stops after the producers are done and nothing came for this long
    idle_consumers: int  # the idle scenario: consumers (queue objects) waiting on an empty queue
    idle_window_s: float  # ... for this long, their commands counted
    bucket_max_size: int
    bucket_max_wait_s: float
    job_timeout_s: float


@dataclass(frozen=True)
class Job:
    contender: str
    # push | push_many | consume | consume_batch | end_to_end | stream_push | latency | idle | encode | decode
    scenario: str
    payload_bytes: int
    processes: int
    messages: int
    write_concern: str = "1"

    @property
    def cell(self) -> tuple:
        return self.scenario, self.payload_bytes, self.processes, self.write_concern

    @property
    def bytes_written(self) -> int:
        return 0 if self.scenario in ("encode", "decode") else self.messages * self.payload_bytes

    @property
    def label(self) -> str:
        wc = "" if self.write_concern == "1" else f" w:{self.write_concern}"
        return f"{self.contender} {self.scenario} {human_bytes(self.payload_bytes)} x{self.processes}{wc}"


def human_bytes(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def pad_len(payload_bytes: int) -> int:
    return max(0, payload_bytes - JSON_OVERHEAD)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x for x in text.split(",") if x)
        unknown = set(names) - set(allowed)
        if unknown:
            choices = ", ".join(allowed)
            raise argparse.ArgumentTypeError(f"unknown: {', '.join(sorted(unknown))} (choose from {choices})")
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="the ~4.5-minute version")
    parser.add_argument("--contenders", type=_names(ALL), help=f"comma list of {','.join(ALL)}")
    parser.add_argument("--scenarios", type=_names(ALL_SCENARIOS), help=f"comma list of {','.join(ALL_SCENARIOS)}")
    parser.add_argument("--payloads", type=_ints, help="payload sizes in bytes, e.g. 100,1024,10240")
    parser.add_argument("--processes", type=_ints, help="process counts, e.g. 1,2")
    parser.add_argument("--messages", type=int, help="messages per job (bucketq, keuss, floor)")
    parser.add_argument("--naive-messages", type=int, help="messages per job for the naive queue")
    parser.add_argument("--concurrency", type=int, help="consumer tasks/threads per process")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up rounds")
    parser.add_argument("--rounds", type=int, help="runs of each cell (median reported; default 3)")


def settings(args: argparse.Namespace) -> Settings:
    quick = args.quick
    processes = args.processes or (1, 2)
    return Settings(
        quick=quick,
        warmup=not args.no_warmup,
        rounds=max(1, args.rounds or 3),
        contenders=args.contenders or ALL,
        scenarios=args.scenarios or ALL_SCENARIOS,
        payloads=args.payloads or ((1024,) if quick else (100, 1024, 10240)),
        processes=processes,
        e2e_processes=(processes[0],) if quick and not args.processes else processes,
        # quick: 60,000, not fewer: at 20,000 a job lasted a fifth of a second, and keuss, which acknowledges
        # before writing, spent a good part of it in its final drain.
        messages=args.messages or (60_000 if quick else 100_000),
        naive_messages=args.naive_messages or (2_000 if quick else 3_000),
        codec_messages=args.messages or (100_000 if quick else 1_000_000),
        byte_budget=(64 if quick else 256) << 20,
        concurrency=args.concurrency or 16,
        window=4096,
        idle_s=1.0,
        idle_consumers=4,
        idle_window_s=30.0 if quick else 180.0,
        bucket_max_size=1024,
        bucket_max_wait_s=0.5,
        job_timeout_s=120.0 if quick else 900.0,
    )


def _messages(cfg: Settings, contender: str, payload_bytes: int) -> int:
    base = cfg.naive_messages if contender == "naive" else cfg.messages
    return max(1, min(base, max(cfg.bucket_max_size, cfg.byte_budget // payload_bytes)))


def _queue_jobs(cfg: Settings, scenario: str, payloads, processes, write_concern: str = "1") -> list[Job]:
    return [
        Job(c, scenario, size, n, _messages(cfg, c, size), write_concern)
        for size in payloads
        for n in processes
        for c in cfg.contenders
        if scenario in SCENARIOS[c]
    ]


def jobs(cfg: Settings, majority_supported: bool) -> tuple[list[Job], list[dict]]:
    """The jobs to run, in order, and the rows of what is skipped (with the reason)."""
    out: list[Job] = []
    skipped: list[dict] = []
    for scenario in MAIN_SCENARIOS:
        if scenario in cfg.scenarios:
            procs = cfg.e2e_processes if scenario == "end_to_end" else cfg.processes
            out += _queue_jobs(cfg, scenario, cfg.payloads, procs)
    middle = cfg.payloads[len(cfg.payloads) // 2]
    if "latency" in cfg.scenarios:
        out += [Job(c, "latency", middle, 1, LATENCY_MESSAGES) for c in cfg.contenders if "latency" in SCENARIOS[c]]
    if "idle" in cfg.scenarios and "bucketq" in cfg.contenders:  # idle consumers, then idle stream readers
        out += [Job("bucketq", "idle", middle, 1, IDLE_BACKLOG), Job("bucketq", "stream_idle", middle, 1, IDLE_BACKLOG)]
    if "codec" in cfg.scenarios and "floor" in cfg.contenders:
        out += [Job("floor", s, size, 1, cfg.codec_messages) for size in cfg.payloads for s in ("encode", "decode")]
    if "majority" in cfg.scenarios:
        majority = [j for s in ("push", "consume") for j in _queue_jobs(cfg, s, (middle,), (1,), "majority")]
        if majority_supported:
            out += majority
        else:
            skipped += [
                skip_row(j, "skipped: w:majority needs a replica set; this server is not one") for j in majority
            ]
    return out, skipped


def warmup_jobs(cfg: Settings) -> list[Job]:
    """Short untimed rounds first: the test server is a JVM whose JIT would otherwise favour whoever runs
    later in the run."""
    if not cfg.warmup:
        return []
    return [
        Job(c, s, 1024, 1, 200 if c == "naive" else 5000)
        for s in ("push", "consume")
        for c in cfg.contenders
        if s in SCENARIOS[c]
    ]


def row_of(job: Job) -> dict:
    """A result row's first fields: which job, and no figures yet."""
    return {
        "contender": job.contender,
        "scenario": job.scenario,
        "payload_bytes": job.payload_bytes,
        "processes": job.processes,
        "write_concern": job.write_concern,
        "msgs_per_s": None,
        "commands_per_1000": None,
    }


def skip_row(job: Job, note: str) -> dict:
    return {**row_of(job), "notes": note}

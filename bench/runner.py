"""Runs one job: prefill if the scenario needs it, start the worker processes, say go when all are ready,
show a progress line, and fold the workers' results into one row."""

from __future__ import annotations

import json
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from pymongo.errors import PyMongoError

from bench import contenders
from bench.plan import IDLE_SCENARIOS, Job, Settings, pad_len, row_of
from bench.server import DB, Server
from bench.worker import interpolate, split

ROOT = Path(__file__).resolve().parent.parent
EXIT_GRACE_S = 10.0
SERVER_CPU_EVERY_S = 0.05  # /proc read of the server's CPU: the timed span's figure is interpolated between these


class Worker:
    """One worker process; a thread turns its stdout lines into (worker, message) items of an inbox."""

    def __init__(self, contender: str, spec: dict, inbox: queue.Queue) -> None:
        argv, env = contenders.command(contender, spec)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        self.ready = False
        self.progress = 0
        self.result: dict | None = None
        threading.Thread(target=self._read, args=(inbox,), daemon=True).start()

    def _read(self, inbox: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                inbox.put((self, json.loads(line)))
            except ValueError:
                pass  # not protocol: ignore
        inbox.put((self, None))

    def handle(self, msg: dict | None) -> None:
        if msg is None:
            if self.result is None:
                try:
                    self.proc.wait(timeout=EXIT_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
                self.result = {"error": f"exited with code {self.proc.returncode}: {self.stderr_tail()}"}
        elif "result" in msg:
            self.result = msg["result"]
        elif "progress" in msg:
            self.progress = msg["progress"]
        elif msg.get("ready"):
            self.ready = True

    def send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stderr_tail(self, chars: int = 400) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return text[-chars:].replace("\n", " | ")

    def finish(self) -> None:
        """Let it exit by itself for a while, then kill it (by its own PID)."""
        try:
            self.proc.wait(timeout=EXIT_GRACE_S if self.result is not None else 0.1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


class Progress:
    """One line on stderr: a \\r-updated line on a terminal, a plain line per job elsewhere."""

    def __init__(self, prefix: str, total: int) -> None:
        self.prefix, self.total = prefix, total
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self._shown = 0.0

    def show(self, done: int, phase: str = "") -> None:
        now = time.monotonic()
        if self.tty and now - self._shown >= 0.2:
            self._shown = now
            sys.stderr.write(f"\r\033[K{self.prefix} {phase}{done:,}/{self.total:,} msgs  {now - self.t0:5.1f}s")
            sys.stderr.flush()

    def close(self, summary: str) -> None:
        sys.stderr.write(("\r\033[K" if self.tty else "") + f"{self.prefix} {summary}\n")
        sys.stderr.flush()


def _run_workers(job: Job, specs: list[dict], progress: Progress, phase: str, timeout_s: float,
                 server: Server) -> tuple[list[dict], list[tuple[float, float]]]:
    """The workers' results, and (time, server CPU seconds) samples taken while they ran (none if the server's
    CPU cannot be read here)."""
    inbox: queue.Queue = queue.Queue()
    server_cpu: list[tuple[float, float]] = []
    workers = [Worker(job.contender, spec, inbox) for spec in specs]
    deadline = time.monotonic() + timeout_s
    went = False
    try:
        while any(w.result is None for w in workers):
            if time.monotonic() > deadline:
                for w in workers:
                    w.result = w.result or {"error": f"timed out after {timeout_s:.0f}s: {w.stderr_tail()}"}
                break
            try:
                worker, msg = inbox.get(timeout=0.2)
                worker.handle(msg)
            except queue.Empty:
                pass
            if not went and all(w.ready for w in workers):
                went = True
                for w in workers:
                    w.send("go")
            if not went and any(w.result is not None for w in workers):
                break  # one failed during setup: do not start the others
            progress.show(sum(w.progress for w in workers), phase)
            _sample(server_cpu, server)
    finally:
        for w in workers:
            w.send("quit")  # unblocks a worker still waiting for go
            w.finish()
    _sample(server_cpu, server, every_s=0.0)
    return [w.result or {"error": "did not start (another worker failed during setup)"} for w in workers], server_cpu


def _sample(samples: list[tuple[float, float]], server: Server, every_s: float = SERVER_CPU_EVERY_S) -> None:
    now = time.time()
    if not samples or now - samples[-1][0] >= every_s:
        cpu = server.cpu_s()
        if cpu is not None:
            samples.append((now, cpu))


def _spec(cfg: Settings, server: Server, job: Job, role: str, messages: int, index: int, queue_name: str) -> dict:
    return {
        "uri": server.uri,
        "db": DB,
        "queue": queue_name,
        "role": role,
        "messages": messages,
        "payload_bytes": job.payload_bytes,
        "pad_len": pad_len(job.payload_bytes),
        "write_concern": job.write_concern,
        "worker": index,
        "processes": job.processes,
        "concurrency": cfg.concurrency,
        "window": cfg.window,
        "idle_s": cfg.idle_s,
        "idle_consumers": cfg.idle_consumers,
        "idle_window_s": cfg.idle_window_s,
        "bucket_max_size": cfg.bucket_max_size,
        "bucket_max_wait_s": cfg.bucket_max_wait_s,
    }


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def aggregate(job: Job, results: list[dict], concurrency: int,
              server_cpu: list[tuple[float, float]] | None = None) -> dict:
    """One row from the workers' results; ``server_cpu`` samples (from ``_run_workers``) give the server's CPU
    over the timed span."""
    row: dict = {**row_of(job), "concurrency": concurrency}
    errors = [r["error"] for r in results if r.get("error")]
    if errors:
        row["notes"] = "error: " + "; ".join(sorted(set(errors)))
        return row
    messages = sum(r["messages"] for r in results)
    commands = None if any(r["commands"] is None for r in results) else sum(r["commands"] for r in results)
    latencies = sorted(x for r in results for x in r.get("latencies_ms", []))
    names: Counter[str] = Counter()
    for r in results:
        names.update(r.get("command_names") or {})
    notes = [n for n in {r.get("notes") for r in results} if n]
    if messages != job.messages:
        notes.append(f"INCOMPLETE: {messages:,} of {job.messages:,} messages")
    per_k = 1000.0 / messages if messages else None
    t_start, t_end = min(r["t_start"] for r in results), max(r["t_end"] for r in results)
    covered = server_cpu and server_cpu[0][0] <= t_start and server_cpu[-1][0] >= t_end
    server_s = interpolate(server_cpu, t_end) - interpolate(server_cpu, t_start) if covered else None
    if job.scenario in IDLE_SCENARIOS:
        return _idle_row(row, results[0], names, server_s, notes)
    row.update(
        msgs_per_s=messages / (t_end - t_start) if t_end > t_start and messages else None,
        commands_per_1000=commands * per_k if commands is not None and per_k else None,
        cpu_s_per_1000=sum(r["cpu_s"] for r in results) * per_k if per_k else None,
        server_cpu_s_per_1000=server_s * per_k if server_s is not None and per_k else None,
        client_cores=job.processes,  # one event loop per worker process: a core each at most
        peak_rss_mb=sum(r["peak_rss_mb"] for r in results),
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=_percentile(latencies, 0.99),
        latency_mean_ms=statistics.fmean(latencies) if latencies else None,
        messages=messages,
        complete=messages == job.messages,
        seconds=t_end - t_start,
        commands=commands,
        command_names=dict(names) if commands is not None else None,
        notes="; ".join(notes),
    )
    return row


def _idle_row(row: dict, result: dict, names: Counter[str], server_s: float | None, notes: list[str]) -> dict:
    """The idle scenario's row: no rate, but the commands per idle consumer per minute by kind (``idle``)."""
    idle = result["idle"]
    seconds = result["t_end"] - result["t_start"]
    minutes = idle["consumers"] * seconds / 60.0
    per = {kind: n / minutes for kind, n in idle["kinds"].items()}
    non_stream = sum(v for kind, v in per.items() if kind != "getmores")
    idle.update(window_s=seconds, per_consumer_minute=per, non_stream_per_consumer_minute=non_stream,
                server_cpu_share=server_s / seconds if server_s is not None else None)
    cpu = "" if server_s is None else f"; server CPU {server_s / seconds:.1%} of a core"
    notes.insert(0, f"{idle['consumers']} idle consumers, {seconds:.0f} s, per consumer per minute: "
                    + ", ".join(f"{v:.1f} {kind}" for kind, v in per.items()) + cpu)
    row.update(idle=idle, messages=result["messages"], complete=not any(n.startswith("INCOMPLETE") for n in notes),
               seconds=seconds, commands=sum(names.values()), command_names=dict(names), notes="; ".join(notes))
    return row


def median_round(rounds: list[dict]) -> dict:
    """The row of the round with the median throughput (the lower middle of an even count), noting every
    round's; the first failed round's row if any failed. ``cpu_rounds`` keeps each round's client CPU per 1000
    messages in the order they ran, for the CPU goals' paired ratios (``report.goals``)."""
    failed = [r for r in rounds if r["msgs_per_s"] is None]
    if failed:
        return failed[0]
    cpu_rounds = [r.get("cpu_s_per_1000") for r in rounds]
    if len(rounds) == 1:
        return {**rounds[0], "cpu_rounds": cpu_rounds}
    ordered = sorted(rounds, key=lambda r: r["msgs_per_s"])
    row = dict(ordered[(len(ordered) - 1) // 2], cpu_rounds=cpu_rounds)
    spread = ", ".join(f"{r['msgs_per_s']:,.0f}" for r in rounds)
    row["notes"] = "; ".join(n for n in (row.get("notes"), f"median of {len(rounds)} rounds ({spread} msgs/s)") if n)
    return row


def run_job(job: Job, cfg: Settings, server: Server, tag: str) -> dict:
    """Run one job; tag (e.g. "[ 3/21]") starts its progress line."""
    queue_name = f"{job.contender}_{job.scenario}"
    progress = Progress(f"{tag} {job.label:<34}", job.messages)
    try:
        server.drop_bench_db()
        if job.scenario in ("consume", "consume_batch", *IDLE_SCENARIOS):
            fill_role = "stream_fill" if job.scenario == "stream_idle" else "fill"
            fill_spec = _spec(cfg, server, job, fill_role, job.messages, 0, queue_name)
            fill, _ = _run_workers(job, [fill_spec], progress, "fill ", cfg.job_timeout_s, server)
            if fill[0].get("error"):
                row = aggregate(job, [{"error": "prefill failed: " + fill[0]["error"]}], cfg.concurrency)
                progress.close(row["notes"][:120])
                return row
        specs = [
            _spec(cfg, server, job, job.scenario, n, k, queue_name)
            for k, n in enumerate(split(job.messages, job.processes))
        ]
        results, server_cpu = _run_workers(job, specs, progress, "", cfg.job_timeout_s, server)
        row = aggregate(job, results, cfg.concurrency, server_cpu)
        server.drop_bench_db()
    except PyMongoError as exc:  # the server went away: this row says so, the run goes on
        row = aggregate(job, [{"error": f"server: {type(exc).__name__}: {str(exc)[:200]}"}], cfg.concurrency)
    if row["msgs_per_s"] is None:
        progress.close(row.get("notes", "")[:200])
    else:
        cmds = "" if row["commands_per_1000"] is None else f", {row['commands_per_1000']:.2f} cmds/1000"
        progress.close(f"{row['msgs_per_s']:>12,.0f} msgs/s{cmds}")
    return row

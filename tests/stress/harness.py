"""The stress harness: writers, consumers and crashers as real processes, faults injected, then an account.

    python -m tests.stress [--quick] [--writers N] ... (see ``python -m tests.stress --help``)

Layout. A test server per dedupe mode and one for the stream run (mongo-java-server on its H2 *file* backend
in a temp dir, so that data survives its restarts), or the server of ``BUCKETQ_MONGODB_URI`` (then the server is
not restarted; the report says so). Every writer and consumer process connects through one ``TcpProxy`` on
loopback, so a cut hits all of them; the harness itself watches the server directly.

Phases.
1. write: writer processes push ``MESSAGES_PER_WRITER`` acknowledged messages each (paced over
   ``write_seconds``) while ``CONSUMERS`` steady consumers and ``CRASHERS`` crashing consumers consume.
   Faults, placed by written progress with the seeded RNG: crashers SIGKILL themselves at a random kill
   point (after claim, before ack, mid batch, after ack but before the state flush) or are SIGKILLed by
   the harness at a random moment, and are replaced; writers SIGKILL themselves mid-bucket and are
   replaced by their next generation; the server is stopped and restarted; the proxy cuts every connection.
   Command faults, by the proxy on single commands (``tests/proxy.py``): the reply of a bucket insert is
   lost after the server applied it (the producer retries); the reply, or the request, of a consumer's
   fenced write (a flush, a release, the write that finishes a bucket) is lost; and *delayed retries*: such
   a loss whose retry is held back past the lease, so that it arrives after the bucket may have been
   claimed again or consumed. Clock steps: a steady consumer's wall clock (``time.time``) jumps by tens of
   seconds to minutes, forwards or backwards (SIGUSR1, see ``consumer.py``).
2. drain: no more faults; the crashers still alive are SIGKILLed; the steady consumers empty the queue
   (backlog, and the buckets of killed consumers once their leases expire); then they are stopped with
   SIGTERM (they flush and release what they hold) and one fresh drain consumer checks that nothing is
   left, taking whatever is.
Crash recovery is measured per consumer kill, in both phases: from the SIGKILL until no bucket is leased
by the dead consumer any more (every bucket it held was taken over by another one, or finished).
Then the logs and the ``processed`` collection are compared (``tests.stress.accounting``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from bucketq.core.claims import LIVE  # buckets, not the tombstones finished ones leave behind
from tests.proxy import Command, Rule, TcpProxy
from tests.stress.accounting import account, account_groups, parse_consumer_logs, parse_writer_log
from tests.stress.common import LEASE_S, STOP_S, die_with_parent
from tests.stress.consumer import KILL_POINTS
from tests.stress.streams import StreamConfig, run_streams

ROOT = Path(__file__).resolve().parents[2]
TICK_S = 0.1
# The harness's own reads of the queue (the drain phase's count of buckets left, the recovery tracker's
# aggregation): each one scans the bucket collection on the test server, which keeps no secondary indexes. At
# every tick they were a good part of that server's work, and slowed the consumers they were watching.
WATCH_EVERY_S = 1.0
PROGRESS_EVERY_S = 2.0
STALL_S = 90.0  # a phase with no progress for this long is stuck: stop and account for what happened
# A delayed retry is held back past the lease: meanwhile another consumer may claim the bucket again, or
# finish it (a bucket insert's retry then comes after its messages were consumed).
RETRY_HELD_S = (LEASE_S + 0.5, 3 * LEASE_S)
CLOCK_STEP_S = (20.0, 180.0)  # how far a clock step jumps, either way
FENCED_WRITES = ("update", "delete", "findAndModify")


@dataclass
class Config:
    writers: int = 4
    messages_per_writer: int = 1500
    consumers: int = 4
    crashers: int = 2
    payload_bytes: int = 200
    server_restarts: int = 1
    dedupe: str = "on"  # on | off | both (one run per mode)
    seed: int = 1
    writer_kills: int = 2
    cuts: int = 3
    lost_inserts: int = 2  # lost replies of bucket inserts, retried at once
    lost_fenced: int = 2  # lost replies or requests of fenced writes, retried at once
    delayed_retries: int = 2  # a lost insert or fenced write whose retry is held back past the lease
    clock_steps: int = 2
    batch: int = 25
    groups: int = 2  # ordered groups per writer process, for a quarter of its seqs (0: no grouped messages)
    bucket_max_size: int = 100
    bucket_max_wait: float = 0.05
    # Writers are paced to spread their pushes over this many seconds, so that faults hit a queue that is
    # being written and consumed at once (0: push as fast as possible).
    write_seconds: float = 40.0
    timeout_s: float = 600.0
    keep: bool = False
    streams: bool = True  # then the stream run (tests/stress/streams.py) on the same server

    @property
    def total(self) -> int:
        return self.writers * self.messages_per_writer


@dataclass
class Proc:
    role: str  # writer | consumer | crasher | drain
    popen: subprocess.Popen[bytes]
    log: Path
    started: float
    writer: int = -1
    gen: int = -1
    kill_point: str | None = None  # a crasher's own kill point, or "external" (the harness kills it)
    kill_at: float | None = None  # external kills: monotonic time

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class Faults:
    consumer_kills: Counter = field(default_factory=Counter)
    writer_kills: int = 0
    server_restarts: int = 0
    server_restarts_skipped: str | None = None
    restart_s: list[float] = field(default_factory=list)
    proxy_cuts: int = 0
    commands: list[tuple[str, str, Rule]] = field(default_factory=list)  # (fault, target, its proxy rule)
    clock_steps_s: list[float] = field(default_factory=list)
    not_injected: int = 0

    def command_summary(self) -> dict[str, Any]:
        """What the command faults did: only losses that happened count; a retry held back counts once the
        proxy held it."""
        lost: dict[str, Counter] = {"lose_reply": Counter(), "lose_request": Counter()}
        delayed = {"lost": 0, "held_back": 0}
        unfired = 0
        for fault, target, rule in self.commands:
            if not rule.hits:
                unfired += 1
                continue
            lost[rule.action][target] += 1
            if fault == "delayed_retry":
                delayed["lost"] += 1
                delayed["held_back"] += rule.retries_delayed
        return {"lost_replies": dict(lost["lose_reply"]), "lost_requests": dict(lost["lose_request"]),
                "delayed_retries": delayed, "command_faults_unfired": unfired}


@dataclass(order=True)
class Planned:
    """A command fault or a clock step, and when to inject it."""

    share: float  # of the messages to write: it is injected once this many were written
    kind: str = field(compare=False)  # lost_insert | lost_fenced | delayed_retry | clock_step
    target: str = field(compare=False)  # bucket_insert | fenced_write | consumer
    action: str = field(compare=False)  # lose_reply | lose_request | step
    held_s: float = field(default=0.0, compare=False)  # how long the retry is held back (delayed retries)
    step_s: float = field(default=0.0, compare=False)  # how far the clock jumps (clock steps)
    pick: float = field(default=0.0, compare=False)  # which consumer, as a share of those ready (clock steps)


@dataclass
class _Victim:
    killed_at: float
    messages: int | None = None  # unfinished messages in the buckets it held, when first seen after the kill
    buckets: int = 0


class RecoveryTracker:
    """How long the buckets of each killed consumer stay out of reach: from the kill until no bucket is
    leased by it any more (its lease expired and another consumer claimed the bucket)."""

    def __init__(self) -> None:
        self.pending: dict[str, _Victim] = {}
        self.done: list[tuple[int, int, float]] = []  # (messages, buckets, seconds) per kill that held some

    def killed(self, owner: str, at: float) -> None:
        self.pending[owner] = _Victim(at)

    def poll(self, buckets: Any, now: float) -> None:
        if not self.pending:
            return
        try:
            rows = list(buckets.aggregate([
                {"$match": {"lease.owner": {"$in": list(self.pending)}}},
                {"$group": {"_id": "$lease.owner", "b": {"$sum": 1},
                            "m": {"$sum": {"$subtract": ["$n", {"$size": {"$ifNull": ["$done", []]}}]}}}},
            ]))
        except PyMongoError:
            return  # the server is restarting: look again later
        found = {r["_id"]: r for r in rows}
        for owner, victim in list(self.pending.items()):
            if owner in found:
                if victim.messages is None:
                    victim.messages, victim.buckets = int(found[owner]["m"]), int(found[owner]["b"])
                continue
            del self.pending[owner]
            if victim.messages:
                self.done.append((victim.messages, victim.buckets, now - victim.killed_at))

    def summary(self, kills: int) -> dict[str, Any]:
        seconds = [d for _, _, d in self.done]
        messages = sum(m for m, _, _ in self.done)
        return {"kills": kills, "kills_holding_buckets": len(self.done), "messages": messages,
                "buckets": sum(b for _, b, _ in self.done), "seconds": round(sum(seconds), 2),
                "mean_s": round(sum(seconds) / len(seconds), 2) if seconds else 0.0,
                "max_s": round(max(seconds), 2) if seconds else 0.0,
                "per_s": round(messages / sum(seconds), 1) if seconds else 0.0,
                "not_recovered": len(self.pending)}


class Harness:
    def __init__(self, config: Config, *, dedupe: bool, server_uri: str, restart: Any) -> None:
        self.c = config
        self.dedupe = dedupe
        mode = self.mode = "dedupe" if dedupe else "no-dedupe"
        self.rng = random.Random(f"{config.seed}:{mode}")
        self.restart_server = restart  # callable or None
        self.server_uri = server_uri
        self.db_name = f"stress_{mode.replace('-', '_')}_{os.getpid()}_{int(time.time())}"
        self.queue = "events"
        self.work = Path(tempfile.mkdtemp(prefix=f"bucketq-stress-{mode}-"))
        self.procs: list[Proc] = []
        self.finished: list[Proc] = []
        self.killed_pids: set[int] = set()
        self.clock_stepped: set[int] = set()
        self.faults = Faults()
        self.recovery = RecoveryTracker()
        self._last_poll = 0.0
        self.errors: list[str] = []
        self.writer_gen = [0] * config.writers
        self.writer_done = [False] * config.writers
        self.acked_before_gen = [0] * config.writers  # acks of the writer's earlier generations
        self.counter = LogCounter()
        self.started = time.monotonic()
        self.drain_pid: int | None = None
        self.phase = "setup"
        self._last_progress = 0.0
        self.client: MongoClient = MongoClient(server_uri, serverSelectionTimeoutMS=30_000, tz_aware=True)
        host, port = host_port(server_uri)
        # Meters the queue's write commands (not the harness's own ``processed`` records) for the report.
        self.proxy = TcpProxy(host, port, meter=lambda c: c == self.queue or c.startswith(self.queue + ".")).start()
        self.host = socket.gethostname()

    # -- processes ---------------------------------------------------------------------------------------

    def _spawn(self, role: str, module: str, args: list[str], log: Path, **fields: Any) -> Proc:
        err = open(self.work / f"{log.stem}.stderr", "ab")
        cmd = [sys.executable, "-m", module, self.proxy.uri, self.db_name, self.queue, "--log", str(log), *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        popen = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=err, preexec_fn=die_with_parent)
        err.close()
        proc = Proc(role, popen, log, time.monotonic(), **fields)
        self.procs.append(proc)
        return proc

    def spawn_writer(self, w: int, die_after: int = 0) -> Proc:
        g = self.writer_gen[w]
        target = self.c.messages_per_writer - self.acked_before_gen[w]
        args = ["--writer", str(w), "--gen", str(g), "--target", str(target), *([] if self.dedupe else ["--unkeyed"]),
                "--payload-bytes", str(self.c.payload_bytes), "--bucket-max-size", str(self.c.bucket_max_size),
                "--bucket-max-wait", str(self.c.bucket_max_wait), "--window", str(4 * self.c.bucket_max_size)]
        if self.c.write_seconds:
            args += ["--rate", f"{self.c.messages_per_writer / self.c.write_seconds:.3f}"]
        if die_after:
            args += ["--die-after-acks", str(die_after)]
        if self.c.groups:
            args += ["--groups", str(self.c.groups)]
        return self._spawn("writer", "tests.stress.writer", args, self.work / f"writer{w}.gen{g}.log",
                           writer=w, gen=g)

    def _consumer_args(self) -> list[str]:
        args = ["--batch", str(self.c.batch), "--payload-bytes", str(self.c.payload_bytes)]
        return args + (["--dedupe"] if self.dedupe else [])

    def spawn_consumer(self, i: int) -> Proc:
        log = self.work / f"consumer{i}.{len(self.procs)}.log"
        return self._spawn("consumer", "tests.stress.consumer",
                           [*self._consumer_args(), "--clock-file", str(self._clock_file(log))], log)

    def _clock_file(self, log: Path) -> Path:
        return self.work / f"{log.stem}.clock"

    def spawn_crasher(self) -> Proc:
        point = self.rng.choice([*KILL_POINTS, "external"])
        n = len(self.procs)
        if point == "external":
            # Killed by the harness at a random moment: mid-claim, mid-flush, mid-insert, wherever it is.
            proc = self._spawn("crasher", "tests.stress.consumer", self._consumer_args(),
                               self.work / f"crasher.{n}.log", kill_point=point)
            proc.kill_at = time.monotonic() + self.rng.uniform(1.0, 4.0)
            return proc
        args = [*self._consumer_args(), "--kill-point", point, "--kill-after", str(self.rng.randint(1, 6))]
        return self._spawn("crasher", "tests.stress.consumer", args, self.work / f"crasher.{n}.log",
                           kill_point=point)

    def spawn_drain(self) -> Proc:
        args = [*self._consumer_args(), "--drain", "--deadline", "120"]
        return self._spawn("drain", "tests.stress.consumer", args, self.work / "drain.log")

    def kill(self, proc: Proc) -> None:
        if proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait()
            if proc.role == "crasher":
                proc.kill_point = "external"

    def reap(self) -> list[Proc]:
        """Processes that exited since the last call."""
        gone = [p for p in self.procs if p.popen.poll() is not None]
        for p in gone:
            self.procs.remove(p)
            self.finished.append(p)
            if p.popen.returncode == -signal.SIGKILL:
                self.killed_pids.add(p.pid)
                if p.role == "crasher":
                    self.faults.consumer_kills[p.kill_point] += 1
                    self.recovery.killed(f"{self.host}:{p.pid}", time.monotonic())
        return gone

    def stop_all(self) -> None:
        for p in list(self.procs):
            self.kill(p)
        self.reap()

    # -- progress ----------------------------------------------------------------------------------------

    def acked(self, w: int) -> int:
        """Acknowledged pushes of writer ``w`` so far (its logs, read incrementally)."""
        return self.acked_before_gen[w] + sum(self.counter.count(p.log, b"ok ") for p in self.procs
                                              if p.role == "writer" and p.writer == w)

    def written(self) -> int:
        return sum(self.acked(w) for w in range(self.c.writers))

    def processed(self) -> int:
        """Messages handled and acked so far, by every consumer there was (their logs)."""
        return sum(self.counter.count(path, b" ", prefix=b"ack ") for path in self.work.glob("*.log")
                   if not path.name.startswith("writer"))

    def progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        kills = sum(self.faults.consumer_kills.values())
        print(f"stress[{self.mode}] {now - self.started:6.1f}s {self.phase:<14} written {self.written()}/"
              f"{self.c.total} processed {self.processed()} | consumer kills {kills} writer kills "
              f"{self.faults.writer_kills} restarts {self.faults.server_restarts} cuts {self.faults.proxy_cuts} "
              f"command faults {len(self.faults.commands)} clock steps {len(self.faults.clock_steps_s)} | "
              f"procs {len(self.procs)}", file=sys.stderr, flush=True)

    # -- phases ------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            try:
                return self._run()
            except Exception as exc:  # a timeout or a harness error: still account for what happened
                self.errors.append(f"harness: {type(exc).__name__}: {exc}")
                self.stop_all()
                elapsed = time.monotonic() - self.started
                try:
                    return self._report(write_s=elapsed, drain_s=0.0, drained=0)
                except Exception as second:
                    self.errors.append(f"harness: no account: {type(second).__name__}: {second}")
                    return {"ok": False, "failures": list(self.errors), "dedupe": self.dedupe,
                            **{k: None for k in ("written", "processed", "lost", "duplicated",
                                                 "duplicates_explained", "redelivered_in_flight", "unexpected",
                                                 "left_behind", "groups")},
                            "throughput": {}, "errors": self.errors}
        finally:
            self.stop_all()
            self.proxy.stop()
            self.client.close()

    def _run(self) -> dict[str, Any]:
        c = self.c
        deadline = self.started + c.timeout_s
        # Faults are placed by progress (share of the messages written), so they land mid-run at any speed.
        restarts = sorted(self.rng.uniform(0.2, 0.8) for _ in range(c.server_restarts))
        cuts = sorted(self.rng.uniform(0.1, 0.9) for _ in range(c.cuts))
        if self.restart_server is None and restarts:
            self.faults.server_restarts_skipped = "BUCKETQ_MONGODB_URI is set: the harness does not own the server"
            restarts = []
        others = self._plan()
        writer_kills = [0] * c.writers  # per writer: kills still to do
        for k in range(c.writer_kills):
            writer_kills[k % c.writers] += 1

        def die_after(w: int) -> int:
            if not writer_kills[w]:
                return 0
            writer_kills[w] -= 1
            remaining = c.messages_per_writer - self.acked_before_gen[w]
            return max(1, int(remaining * self.rng.uniform(0.1, 0.6 if writer_kills[w] else 0.8)))

        self.phase = "write"
        t_write = time.monotonic()
        for i in range(c.consumers):
            self.spawn_consumer(i)
        for _ in range(c.crashers):
            self.spawn_crasher()
        for w in range(c.writers):
            self.spawn_writer(w, die_after(w))
        respawn_at: list[float] = []

        stall = Stall("write", STALL_S)
        while not all(self.writer_done):
            self._check_deadline(deadline)
            stall.check(self.written())
            now = time.monotonic()
            for p in self.procs:
                if p.kill_at is not None and now >= p.kill_at:
                    self.kill(p)
            for p in self.reap():
                rc = p.popen.returncode
                if p.role == "writer":
                    self.acked_before_gen[p.writer] += self.counter.count(p.log, b"ok ")
                    if rc == 0:
                        self.writer_done[p.writer] = True
                        continue
                    if rc == -signal.SIGKILL:
                        self.faults.writer_kills += 1
                    else:
                        self.errors.append(f"writer {p.writer}.{p.gen} exited {rc}: {self._stderr_tail(p)}")
                    self.writer_gen[p.writer] += 1
                    if self.writer_gen[p.writer] > 20:
                        raise RuntimeError(f"writer {p.writer} keeps failing: {self._stderr_tail(p)}")
                    self.spawn_writer(p.writer, die_after(p.writer))
                elif p.role == "crasher":
                    if rc != -signal.SIGKILL:
                        self.errors.append(f"crasher {p.pid} ({p.kill_point}) exited {rc}: {self._stderr_tail(p)}")
                    respawn_at.append(now + self.rng.uniform(0.2, 1.0))
                else:
                    self.errors.append(f"{p.role} {p.pid} exited {rc} mid-run: {self._stderr_tail(p)}")
                    self.spawn_consumer(len(self.procs))
            for at in [a for a in respawn_at if a <= now]:
                respawn_at.remove(at)
                self.spawn_crasher()
            share = self.written() / c.total
            while cuts and share >= cuts[0]:
                cuts.pop(0)
                self._cut()
            if restarts and share >= restarts[0]:
                restarts.pop(0)
                self._restart()
            while others and share >= others[0].share and self._inject(others[0]):
                others.pop(0)
            self._tick()
        for _ in cuts:  # the writers outran a fault's place: still inject it, before the drain
            self._cut()
        for _ in restarts:
            self._restart()
        self.proxy.disarm()  # command faults that found no command in time are reported as unfired
        self.faults.not_injected = len(others)  # clock steps that found no consumer ready
        write_s = time.monotonic() - t_write

        self.phase = "drain"
        self.progress(force=True)
        t_drain = time.monotonic()
        processed_before_drain = self.processed()
        for p in [p for p in self.procs if p.role == "crasher"]:
            self.kill(p)
        self.reap()
        buckets = self.client[self.db_name][self.queue]
        stall = Stall("drain", STALL_S)
        counted = 0.0
        while True:
            self._check_deadline(deadline)
            if time.monotonic() - counted < WATCH_EVERY_S:
                self._tick()
                continue
            counted = time.monotonic()
            try:
                left = buckets.count_documents(LIVE)
            except PyMongoError:
                left = -1
            if left == 0 or not any(p.role == "consumer" for p in self.procs):
                break
            try:
                stall.check((left, self.processed()))
            except TimeoutError as exc:  # let the drain consumer and the account say what is stuck
                self.errors.append(str(exc))
                break
            for p in self.reap():
                self.errors.append(f"{p.role} {p.pid} exited {p.popen.returncode} mid-drain: {self._stderr_tail(p)}")
            self._tick()
        for p in self.procs:
            p.popen.send_signal(signal.SIGTERM)
        for p in list(self.procs):
            try:
                p.popen.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.errors.append(f"{p.role} {p.pid} did not stop within {STOP_S:g} s of SIGTERM")
                self.kill(p)
        for p in self.reap():
            if p.popen.returncode != 0:
                self.errors.append(f"{p.role} {p.pid} exited {p.popen.returncode} on SIGTERM: "
                                   f"{self._stderr_tail(p)}")
        drain = self.spawn_drain()
        self.drain_pid = drain.pid
        while drain.popen.poll() is None:
            self._check_deadline(deadline)
            self._tick()
        self.reap()
        if drain.popen.returncode != 0:
            self.errors.append(f"drain consumer exited {drain.popen.returncode}: {self._stderr_tail(drain)}")
        drain_s = time.monotonic() - t_drain
        self.recovery.poll(buckets, time.monotonic())
        self.phase = "account"
        self.progress(force=True)
        return self._report(write_s=write_s, drain_s=drain_s, drained=self.processed() - processed_before_drain)

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_poll >= WATCH_EVERY_S:
            self._last_poll = now
            self.recovery.poll(self.client[self.db_name][self.queue], now)
        self.progress()
        time.sleep(TICK_S)

    def _cut(self) -> None:
        self.proxy.cut()
        self.faults.proxy_cuts += 1

    def _plan(self) -> list[Planned]:
        """Command faults and clock steps, drawn up front: the seed alone decides what each one is."""
        c = self.c
        plan = []
        first_sign = self.rng.choice([-1, 1])
        for kind, n in (("lost_insert", c.lost_inserts), ("lost_fenced", c.lost_fenced),
                        ("delayed_retry", c.delayed_retries), ("clock_step", c.clock_steps)):
            for i in range(n):
                # Command faults by 80% of the writes, so that inserts are still coming to hit.
                share = self.rng.uniform(0.1, 0.9 if kind == "clock_step" else 0.8)
                if kind == "clock_step":  # alternately forwards and backwards
                    step_s = round(first_sign * (-1) ** i * self.rng.uniform(*CLOCK_STEP_S), 1)
                    plan.append(Planned(share, kind, "consumer", "step", step_s=step_s, pick=self.rng.random()))
                    continue
                target = "bucket_insert" if kind == "lost_insert" else "fenced_write"
                if kind == "delayed_retry":
                    target = self.rng.choice(["bucket_insert", "fenced_write"])
                # Only a fenced write lost before the server applied it can make a retry that matches nothing
                # (another consumer claimed the bucket meanwhile) look applied; a bucket insert lost that way
                # is a plain failed write.
                action = "lose_reply" if target == "bucket_insert" else self.rng.choice(["lose_reply", "lose_request"])
                held_s = self.rng.uniform(*RETRY_HELD_S) if kind == "delayed_retry" else 0.0
                plan.append(Planned(share, kind, target, action, held_s=held_s))
        return sorted(plan)

    def _inject(self, fault: Planned) -> bool:
        """Inject a command fault or a clock step; False when it must wait (no consumer ready for a step)."""
        if fault.kind == "clock_step":
            return self._step_clock(fault)
        lose = self.proxy.lose_reply if fault.action == "lose_reply" else self.proxy.lose_request
        if fault.target == "bucket_insert":
            rule = lose("insert", collection=self.queue, retry_delay_s=fault.held_s)
        else:
            rule = lose(*FENCED_WRITES, collection=self.queue, where=is_fenced, retry_delay_s=fault.held_s)
        self.faults.commands.append((fault.kind, fault.target, rule))
        return True

    def _step_clock(self, fault: Planned) -> bool:
        ready = [p for p in self.procs if p.role == "consumer" and p.popen.poll() is None
                 and self.counter.count(p.log, b" ", prefix=b"ack ")]  # its SIGUSR1 handler is surely installed
        if not ready:
            return False
        fresh = [p for p in ready if p.pid not in self.clock_stepped] or ready  # steps that cancel out prove little
        victim = fresh[int(fault.pick * len(fresh))]
        self._clock_file(victim.log).write_text(str(fault.step_s))
        os.kill(victim.pid, signal.SIGUSR1)
        self.clock_stepped.add(victim.pid)
        self.faults.clock_steps_s.append(fault.step_s)
        return True

    def _restart(self) -> None:
        started = time.monotonic()
        self.restart_server()
        self.faults.server_restarts += 1
        self.faults.restart_s.append(round(time.monotonic() - started, 2))

    def _check_deadline(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stress run did not finish within {self.c.timeout_s:g} s (phase {self.phase})")

    def _stderr_tail(self, p: Proc, lines: int = 5) -> str:
        try:
            text = (self.work / f"{p.log.stem}.stderr").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    # -- the account -------------------------------------------------------------------------------------

    def _report(self, *, write_s: float, drain_s: float, drained: int) -> dict[str, Any]:
        db = self.client[self.db_name]
        writer_logs = [parse_writer_log(int(f.name[6:].split(".")[0]), int(f.name.split(".gen")[1].split(".")[0]),
                                        f.read_text()) for f in sorted(self.work.glob("writer*.gen*.log"))]
        consumer_logs = parse_consumer_logs(f.read_text() for f in self.work.glob("*.log")
                                            if not f.name.startswith("writer"))
        records = [{"at": doc["at"], **entry, "_id": f"{doc['_id']}:{i}", "pid": doc["pid"]}
                   for doc in db["processed"].find() for i, entry in enumerate(doc["m"])]
        if self.c.keep:  # for a post-mortem: the database goes with the test server
            with (self.work / "processed.jsonl").open("w") as f:
                for r in records:
                    f.write(json.dumps(r, default=str) + "\n")
            (self.work / "killed_pids.json").write_text(json.dumps(sorted(self.killed_pids)))
        result = account(writer_logs, records, consumer_logs, killed_pids=self.killed_pids, dedupe=self.dedupe,
                         max_in_flight_per_kill=self.c.batch)
        groups = account_groups(records, consumer_logs, groups=self.c.groups, killed_pids=self.killed_pids)
        buckets = list(db[self.queue].find(LIVE, {"n": 1, "done": 1}))
        left = {"buckets": len(buckets),
                "messages": sum(d.get("n", 0) - len(d.get("done", [])) for d in buckets),
                "dead_letters": db[f"{self.queue}.dead"].count_documents({}),
                "quarantined": db[f"{self.queue}.quarantine"].count_documents({})}
        counts = result.pop("_counts")
        failures = []
        if result["lost"]:
            failures.append(f"{result['lost']} acknowledged messages lost")
        if result["unexpected"]:
            failures.append(f"{result['unexpected']} unexpected messages")
        if result["duplicated"]:
            failures.append(f"{result['duplicated']} duplicates outside the at-least-once windows "
                            f"(dedupe {'on' if self.dedupe else 'off'})")
        if counts["uncommitted_without_kill"] or counts["in_flight_over_limit"]:
            failures.append("handled-but-unacked records that no kill or lost lease explains")
        if any(left.values()):
            failures.append(f"left behind: {left}")
        if groups["order_violations"] or groups["overlaps"]:
            failures.append(f"ordered groups: {groups['order_violations']} order violations, {groups['overlaps']} "
                            "messages of a group handled at once")
        if self.errors:
            failures.append(f"{len(self.errors)} process errors")

        def rate(n: int, s: float) -> dict[str, float]:
            return {"messages": n, "seconds": round(s, 2), "per_s": round(n / s, 1) if s > 0 else 0.0}

        return {
            "ok": not failures,
            "failures": failures,
            "dedupe": self.dedupe,
            "written": result["written"],
            "processed": result["processed"],
            "lost": result["lost"],
            "duplicated": result["duplicated"],
            "duplicates_explained": result["duplicates_explained"],
            "redelivered_in_flight": result["redelivered_in_flight"],
            "leases_lost": result["leases_lost"],
            "unexpected": result["unexpected"],
            "left_behind": left,
            "unacked_pushes": result["unacked_pushes"],
            "groups": groups,
            "faults": {"consumer_kills": dict(self.faults.consumer_kills),
                       "writer_kills": self.faults.writer_kills,
                       "server_restarts": self.faults.server_restarts,
                       "server_restarts_skipped": self.faults.server_restarts_skipped,
                       "server_restart_s": self.faults.restart_s,
                       "proxy_cuts": self.faults.proxy_cuts,
                       **self.faults.command_summary(),
                       "clock_steps_s": self.faults.clock_steps_s,
                       "clock_steps_not_injected": self.faults.not_injected},
            "throughput": {
                "write": rate(result["written"], write_s),
                "crash_recovery": self.recovery.summary(sum(self.faults.consumer_kills.values())),
                "drain": rate(drained, drain_s),
                "total": rate(result["processed"], write_s + drain_s),
            },
            "bytes_written": sum(self.proxy.written.values()),
            "bytes_written_per_message": round(sum(self.proxy.written.values()) / max(1, result["written"]), 1),
            "write_commands": {"bytes": dict(self.proxy.written), "count": dict(self.proxy.writes),
                               "per_message": round(sum(self.proxy.writes.values()) / max(1, result["written"]), 2)},
            "records": len(records),
            "problems": {k: v for k, v in result["problems"].items() if v},
            "errors": self.errors[:20],
        }

    def cleanup(self) -> None:
        if self.c.keep:
            print(f"stress[{self.mode}]: kept the logs in {self.work}, and the database {self.db_name} "
                  "(gone with the test server, unless BUCKETQ_MONGODB_URI is set)", file=sys.stderr)
            return
        try:
            self.client_drop()
        finally:
            shutil.rmtree(self.work, ignore_errors=True)

    def client_drop(self) -> None:
        client: MongoClient = MongoClient(self.server_uri, serverSelectionTimeoutMS=10_000)
        try:
            client.drop_database(self.db_name)
        except PyMongoError:
            pass
        finally:
            client.close()


class Stall:
    """Raises TimeoutError when a progress value has not changed for ``limit_s`` seconds."""

    def __init__(self, what: str, limit_s: float) -> None:
        self.what = what
        self.limit_s = limit_s
        self.value: Any = None
        self.since = time.monotonic()

    def check(self, value: Any) -> None:
        now = time.monotonic()
        if value != self.value:
            self.value, self.since = value, now
        elif now - self.since > self.limit_s:
            raise TimeoutError(f"no progress in the {self.what} phase for {self.limit_s:g} s (at {value})")


class LogCounter:
    """Counts, in growing log files, the lines that start with a token (or the words after a prefix),
    reading only what was appended since the last call."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[Path, bytes, bytes], int] = {}
        self._counts: dict[tuple[Path, bytes, bytes], int] = {}

    def count(self, path: Path, token: bytes, *, prefix: bytes = b"") -> int:
        key = (path, token, prefix)
        try:
            with path.open("rb") as f:
                f.seek(self._offsets.get(key, 0))
                data = f.read()
        except FileNotFoundError:
            return 0
        complete = data[:data.rfind(b"\n") + 1]
        self._offsets[key] = self._offsets.get(key, 0) + len(complete)
        if prefix:
            found = sum(line.count(token) for line in complete.split(b"\n") if line.startswith(prefix))
        else:
            found = sum(1 for line in complete.split(b"\n") if line.startswith(token))
        self._counts[key] = self._counts.get(key, 0) + found
        return self._counts[key]


def is_fenced(command: Command) -> bool:
    """A write conditioned on a claim's token (``{_id, "lease.token": token}``, docs/FORMAT.md): a consumer's
    flush, release, or the write that finishes a bucket; not a claim."""
    body = command.body
    filters = [s.get("q") for s in [*body.get("updates", []), *body.get("deletes", [])] if isinstance(s, dict)]
    return any(isinstance(f, dict) and "lease.token" in f for f in [*filters, body.get("query")])


def host_port(uri: str) -> tuple[str, int]:
    """The host and port of a single-host URI: what the proxy forwards to (the soak run's too)."""
    netloc = urlsplit(uri).netloc.rsplit("@", 1)[-1]
    if "," in netloc:
        raise ValueError(f"{uri}: the proxy needs a single host:port")
    host, _, port = netloc.rpartition(":")
    return (host or netloc).strip("[]"), int(port or 27017)


MODE_KEYS = ("ok", "written", "lost", "duplicated", "duplicates_explained", "unexpected")  # per mode, in "modes"


@contextlib.contextmanager
def _server(uri: str | None) -> Iterator[tuple[str, Callable[[], None] | None]]:
    """``(uri, restart)``: ``uri`` as given (a server the harness cannot restart), or a fresh test server on an H2
    file of its own (data survives its restarts), stopped and deleted afterwards."""
    from devtools.testserver import LONG_RUN_OPLOG_WINDOW_S, TestServer

    if uri:
        yield uri, None
        return
    h2_dir = Path(tempfile.mkdtemp(prefix="bucketq-stress-h2-"))
    server = TestServer(h2_file=h2_dir / "stress", oplog_window_s=LONG_RUN_OPLOG_WINDOW_S).start()
    try:
        yield server.uri, server.restart
    finally:
        server.stop()
        shutil.rmtree(h2_dir, ignore_errors=True)


def run(config: Config) -> dict[str, Any]:
    """Run the harness once per dedupe mode asked for, then the stream run, each on a test server of its own (or
    all on ``BUCKETQ_MONGODB_URI``). With both modes the report has the totals of both at the top and each mode's
    own report under ``runs``.

    A server of its own per mode: the test server's H2 file only grows (300 MB after the full run's first mode,
    for 15 MB of payload), and a server restarted on the file the first mode left answered the second mode's
    claims in seconds, with the consumers making almost no progress (12,372 processed, then 12,473 fifteen
    seconds later), whichever version of bucketq ran; each mode alone on a fresh server finished in 155 s."""
    uri = os.environ.get("BUCKETQ_MONGODB_URI")
    reports = []
    for dedupe in {"on": [True], "off": [False], "both": [True, False]}[config.dedupe]:
        with _server(uri) as (server_uri, restart):
            harness = Harness(config, dedupe=dedupe, server_uri=server_uri, restart=restart)
            try:
                reports.append(harness.run())
            finally:
                harness.cleanup()
    streams = None
    if config.streams:
        with _server(uri) as (server_uri, _):
            streams = run_streams(server_uri, StreamConfig(seed=config.seed, keep=config.keep))
    report = reports[0] if len(reports) == 1 else _combine(reports)
    report["modes"] = {("on" if r["dedupe"] else "off"): {k: r[k] for k in MODE_KEYS} for r in reports}
    if streams is not None:
        report["stream"] = streams
        if not streams["ok"]:
            report["ok"] = False
            report["failures"] = [*report["failures"], f"stream: lost {streams['lost']}, duplicated "
                                  f"{streams['duplicated']}, unexpected {streams['unexpected']}, "
                                  f"errors {streams['errors']}"]
    report["server"] = "BUCKETQ_MONGODB_URI" if uri else "mongo-java-server (H2 file backend), one per run"
    report["seed"] = config.seed
    report["config"] = asdict(config)
    return report


def _combine(reports: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"ok": all(r["ok"] for r in reports),
                             "failures": [f"{'dedupe' if r['dedupe'] else 'no-dedupe'}: {f}"
                                          for r in reports for f in r["failures"]]}
    for key in ("written", "processed", "lost", "duplicated", "duplicates_explained", "redelivered_in_flight",
                "unexpected"):
        total[key] = sum(r[key] or 0 for r in reports)
    total["bytes_written"] = sum(r.get("bytes_written", 0) for r in reports)
    total["bytes_written_per_message"] = round(total["bytes_written"] / max(1, total["written"]), 1)
    total["left_behind"] = {k: sum((r["left_behind"] or {}).get(k, 0) for r in reports)
                            for k in ("buckets", "messages", "dead_letters", "quarantined")}
    total["groups"] = {k: sum((r["groups"] or {}).get(k, 0) for r in reports)
                       for k in ("groups", "records", "order_violations", "overlaps", "redelivered")}
    total["throughput"] = {}
    for phase in ("write", "crash_recovery", "drain", "total"):
        rows = [r["throughput"][phase] for r in reports if phase in r["throughput"]]
        messages = sum(t["messages"] for t in rows)
        seconds = round(sum(t["seconds"] for t in rows), 2)
        total["throughput"][phase] = {"messages": messages, "seconds": seconds,
                                      "per_s": round(messages / seconds, 1) if seconds else 0.0}
    total["runs"] = {("dedupe" if r["dedupe"] else "no_dedupe"): r for r in reports}
    return total

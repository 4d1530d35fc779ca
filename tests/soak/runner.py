"""The soak runner: the server, the role processes, the resource sampler, the faults, the drain, the verdict.

    python -m tests.soak --minutes M [--seed S] [--keep-results]     (make soak MINUTES=60 SEED=...)

Layout. A test server on its H2 file backend (data survives its restarts), or the server of
``BUCKETQ_MONGODB_URI`` (then it is neither restarted nor stalled: the report says so). Every role process
connects through one ``TcpProxy`` (``tests/proxy.py``), so cuts and command faults hit them all; the runner
itself and its sampler talk to the server directly.

Roles (``ROLES``; a process is named ``<role>-<i>.g<generation>``: a killed one is replaced by its next
generation): producers, async and sync ``Worker``s, rate-limited consumers, a ``BatchQueue``, an outbox relay,
a scheduler and a stream with a reader group. Processes ``<role>-0`` of the killable roles are the control set,
never killed (``faults.CONTROL``).

Phases. Faults from ``faults.plan(seed, minutes)`` for ``minutes``; then the drain: the producers and the relay
stop (SIGTERM: they finish what they started), the consumers go on until every queue is empty (or
``DRAIN_S``), then everything stops with SIGTERM; then ``tests.soak.checker`` and ``tests.soak.trends`` judge the
run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from bucketq.core.claims import LIVE
from bucketq.core.housekeeping import HOUSEKEEPING_EVERY_S
from bucketq.shell.redaction import redact
from tests.proxy import TcpProxy
from tests.soak import faults, role
from tests.soak.consumer import BATCH as CONSUMER_BATCH
from tests.soak.handlers import HANDLER_TIMEOUT_S
from tests.soak.history import History
from tests.soak.stream import RETENTION_S as STREAM_RETENTION_S
from tests.stress.common import die_with_parent
from tests.stress.harness import FENCED_WRITES, host_port, is_fenced

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
# role -> (module, how many, extra flags per index)
ROLES: dict[str, tuple[str, int, dict[int, list[str]]]] = {
    "producer": ("tests.soak.producer", 2, {}),
    "worker": ("tests.soak.worker", 3, {2: ["--sync"]}),
    "consumer": ("tests.soak.consumer", 2, {}),
    "batch": ("tests.soak.batch", 1, {}),
    "relay": ("tests.soak.relay", 1, {}),
    "scheduler": ("tests.soak.scheduler", 1, {}),
    "stream": ("tests.soak.stream", 1, {}),
}
WRITERS = ("producer", "relay")  # stopped first at the drain
CLOCK_STEPPED = ("worker", "consumer")
SAMPLE_S = 3.0
# How long the document counts kept for a time take to level off: the longest a run keeps them (the stream's
# retention, tombstones), then a housekeeping round to delete them. The trends compare those counts from there on.
DOCUMENTS_SETTLE_S = max(role.TOMBSTONES_KEPT_S, STREAM_RETENTION_S) + HOUSEKEEPING_EVERY_S
READY_S = 120.0
PROGRESS_S = 10.0
TICK_S = 0.1
RESPAWN_S = (0.5, 1.5)
DRAIN_S = 90.0
STOP_S = 40.0  # a role's SIGTERM to exit: drain_timeout, a flush, a close, on a loaded machine
SAMPLER_TIMEOUT_MS = 2_000
SERVER_HEAP = "160m"
ERRORS_SHOWN = 20
VIOLATIONS_SHOWN = 5  # in the report; the rest: python -m tests.soak.checker <run> (with --keep-results)
OUTAGES = {"restart": "server_restart", "stall": "server_stall"}  # fault kind -> its name in the history
QUEUES = (role.QUEUE, role.RATED, role.BULK, role.TICKS)
UNDONE = {"$subtract": ["$n", {"$size": {"$ifNull": ["$done", []]}}]}  # a bucket's messages not finished


@dataclass
class Proc:
    """A role process: its role, its index in the role, its generation (one more per replacement)."""
    role: str
    index: int
    gen: int
    popen: subprocess.Popen[bytes]

    @property
    def name(self) -> str:
        """As in the history: ``<role>-<index>.g<generation>``."""
        return f"{self.role}-{self.index}.g{self.gen}"

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.popen.pid


@dataclass
class Server:
    """The server the run uses: ``uri`` for the runner, and the test server (None: ``BUCKETQ_MONGODB_URI``)."""

    uri: str
    test_server: Any = None
    stalled: bool = False
    generation: int = 0  # restarts so far

    @property
    def process(self) -> str:
        """The server's samples of what a restart resets (RSS, connections, cursors): one series per process."""
        return f"server.g{self.generation}"

    @property
    def pid(self) -> int | None:
        """The test server's process id (it changes with each restart); None on ``BUCKETQ_MONGODB_URI``."""
        return self.test_server.pid if self.test_server is not None else None

    def stall(self) -> None:
        """SIGSTOP the test server: it holds every connection and answers nothing."""
        assert self.pid is not None
        os.kill(self.pid, signal.SIGSTOP)
        self.stalled = True

    def resume(self) -> None:
        """SIGCONT it, if stalled."""
        if self.stalled and self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)
        self.stalled = False


@dataclass
class Tally:
    """What the run did: faults injected and skipped, process errors, restart times."""
    injected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)


class Runner:
    """One soak run on ``server``: its processes, faults, samples and history (``run``, then ``close``)."""
    def __init__(self, seed: int, minutes: float, run_dir: Path, server: Server) -> None:
        self.seed = seed
        self.minutes = minutes
        self.run_dir = run_dir
        self.server = server
        self.db_name = f"soak_{seed}_{os.getpid()}"
        self.rng = random.Random(f"soak-runner:{seed}")  # respawn delays: not part of the fault schedule
        self.procs: dict[tuple[str, int], Proc] = {}
        self.generations: Counter[tuple[str, int]] = Counter()
        self.respawn_at: dict[tuple[str, int], float] = {}
        self.stopping: set[str] = set()  # roles not respawned any more
        self.tally = Tally()
        self.client: MongoClient[Any] = MongoClient(server.uri, tz_aware=True, serverSelectionTimeoutMS=30_000)
        self.sampler_client: MongoClient[Any] = MongoClient(
            server.uri, tz_aware=True, serverSelectionTimeoutMS=SAMPLER_TIMEOUT_MS, socketTimeoutMS=SAMPLER_TIMEOUT_MS,
            connectTimeoutMS=SAMPLER_TIMEOUT_MS)
        host, port = host_port(server.uri)
        self.proxy = TcpProxy(host, port).start()
        for sub in ("history", "clock", "ready", "logs"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.history = History(run_dir, "runner")
        self.history.sync_blocking(self.client[self.db_name])
        self.killable = {r: ROLES[r][1] for r in faults.KILLABLE}
        self.plan = faults.plan(seed, minutes, killable=self.killable)
        self._last_progress = 0.0
        self._sampling_done = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, name="soak-sampler", daemon=True)

    # -- processes ---------------------------------------------------------------------------------------------

    def spawn(self, role_name: str, index: int) -> Proc:
        """Start the next generation of process ``index`` of ``role_name``."""
        module, _, extra = ROLES[role_name]
        gen = self.generations[(role_name, index)]
        self.generations[(role_name, index)] += 1
        name = f"{role_name}-{index}.g{gen}"
        cmd = [sys.executable, "-m", module, self.proxy.uri, self.db_name, str(self.run_dir), name,
               "--seed", str(self.seed), *extra.get(index, [])]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(self.run_dir / "logs" / f"{name}.stderr", "ab") as err:
            popen = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=err, preexec_fn=die_with_parent)
        proc = self.procs[(role_name, index)] = Proc(role_name, index, gen, popen)
        return proc

    def ready(self, proc: Proc) -> bool:
        """Its signal handlers are installed (``role._main`` marks it): SIGUSR1 would kill it before."""
        return (self.run_dir / "ready" / proc.name).exists()

    def wait_ready(self) -> None:
        """Until every role process has started (eleven interpreters importing bucketq take tens of seconds on two
        busy cores): the minutes, the fault schedule and the samples count from there, so that the trends' warm-up
        is the work's, not the imports'."""
        deadline = time.monotonic() + READY_S
        while not all(self.ready(p) for p in self.procs.values()):
            if time.monotonic() > deadline:
                late = sorted(p.name for p in self.procs.values() if not self.ready(p))
                self.tally.errors.append(f"not started within {READY_S:g} s: {', '.join(late)}")
                return
            self.reap(time.monotonic())
            time.sleep(TICK_S)

    def kill(self, proc: Proc) -> None:
        """SIGKILL ``proc`` and wait for it."""
        if proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait()

    def reap(self, now: float) -> None:
        """Replace processes that exited (killed, or failed: then the error is kept) unless their role stops."""
        for key, proc in list(self.procs.items()):
            rc = proc.popen.poll()
            if rc is None:
                continue
            del self.procs[key]
            if rc != -signal.SIGKILL and not (proc.role in self.stopping and rc == 0):
                self.tally.errors.append(f"{proc.name} exited {rc}: {self._stderr_tail(proc)}")
            if proc.role not in self.stopping:
                self.respawn_at[key] = now + self.rng.uniform(*RESPAWN_S)
        for key, at in list(self.respawn_at.items()):
            if at <= now and key[0] not in self.stopping:
                del self.respawn_at[key]
                self.spawn(*key)

    def _stderr_tail(self, proc: Proc, lines: int = 3) -> str:
        try:
            text = (self.run_dir / "logs" / f"{proc.name}.stderr").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop_roles(self, roles: list[str], timeout_s: float = STOP_S) -> None:
        """SIGTERM the processes of ``roles`` and wait for them; SIGKILL those still there after ``timeout_s``."""
        self.stopping.update(roles)
        procs = [p for p in self.procs.values() if p.role in roles]
        for p in procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.tally.errors.append(f"{p.name} did not stop within {timeout_s:g} s of SIGTERM")
                self.kill(p)
        self.reap(time.monotonic())

    def kill_all(self) -> None:
        """SIGKILL every process still there (the last resort of ``close``)."""
        for p in list(self.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                self.kill(p)
        self.procs.clear()

    # -- the run -----------------------------------------------------------------------------------------------

    def write_config(self) -> None:
        """A ``config`` record per queue: its rate limit and ``unique_for``, and the tolerances the checker takes
        from the setup (the rest are its defaults)."""
        options = role.queue_options()
        # A cancel request reaches its holder within about lease / 2; a server stall or restart can delay that by
        # its length, and the holder may be a handler run cut off by the handler timeout.
        notice_s = faults.LEASE_S / 2 + options["state_flush_period"] + faults.STALL_S[1] + HANDLER_TIMEOUT_S
        # Starts of the rate-limited queue in a span of per_s: two windows' permits (a span straddles two), and "a
        # permit taken at the very end of a window may be spent just after it" (docs/guide/rate-limits.md): at most
        # one reserve_many's worth per consumer (42 in a span of a 25-minute run, where 40 were allowed).
        rate_extra = role.RATE_LIMIT["count"] + ROLES["consumer"][1] * CONSUMER_BATCH
        tolerance = {"cancel_notice_ms": 1000 * notice_s, "outage_faults": list(OUTAGES.values()),
                     "end_grace_ms": 0.0, "rate_extra": rate_extra}
        for queue in (*QUEUES, role.STREAM):
            self.history.op("config", queue=queue, rate_limit=role.RATE_LIMIT if queue == role.RATED else None,
                            unique_for_s=role.UNIQUE_FOR_S if queue == role.QUEUE else None, tolerance=tolerance,
                            seed=self.seed, minutes=self.minutes, db=self.db_name, lease_s=faults.LEASE_S,
                            max_attempts=role.MAX_ATTEMPTS, handler_timeout_s=HANDLER_TIMEOUT_S)

    def run(self) -> dict[str, Any]:
        """Start the roles, inject the faults for ``minutes``, drain; what happened, for the report."""
        self.write_config()
        for role_name, (_, count, _) in ROLES.items():
            for i in range(count):
                self.spawn(role_name, i)
        self.wait_ready()
        self._sampler.start()
        started = time.monotonic()
        end = started + self.minutes * 60.0
        pending = list(self.plan)
        while time.monotonic() < end:
            now = time.monotonic()
            while pending and started + pending[0].at_s <= now:
                self.inject(pending.pop(0))
            self.reap(now)
            self.progress("faults", started)
            time.sleep(TICK_S)
        self.proxy.disarm()
        faults_s = time.monotonic() - started
        drained = self.drain(started)
        self._sampling_done.set()
        self.sample()
        try:
            self.observe_endings()
        except PyMongoError as exc:
            self.tally.errors.append(f"dead letters not read: {exc}")
        return {"faults_s": round(faults_s, 1), "drain_s": round(time.monotonic() - started - faults_s, 1),
                "drained": drained, "not_injected": len(pending)}

    def drain(self, started: float) -> bool:
        """Writers stop; the rest go on until every queue and the stream's group are empty; then all stop."""
        (self.run_dir / "slow").unlink(missing_ok=True)
        self.stop_roles(list(WRITERS))
        deadline = time.monotonic() + DRAIN_S
        drained = False
        while time.monotonic() < deadline:
            self.reap(time.monotonic())
            self.progress("drain", started)
            if self._empty():
                drained = True
                break
            time.sleep(1.0)
        if not drained:
            self.tally.errors.append(f"the queues were not empty {DRAIN_S:g} s into the drain")
        self.stop_roles([r for r in ROLES if r not in WRITERS])
        return drained

    def _empty(self) -> bool:
        db = self.client[self.db_name]
        try:
            return all(db[q].count_documents(LIVE) == 0 for q in (role.QUEUE, role.RATED, role.BULK))
        except PyMongoError:
            return False

    # -- faults ------------------------------------------------------------------------------------------------

    def inject(self, fault: faults.Fault) -> None:
        """Inject ``fault`` and write it into the history (a kill is also a ``killed`` record)."""
        record = fault.as_record()
        kind = fault.kind
        if kind == "kill":
            proc = self.procs.get((fault.params["role"], fault.params["index"]))
            if proc is None or proc.popen.poll() is not None:
                self.tally.skipped[kind] += 1
                return
            self.history.op("fault", **record, target=proc.name)
            self.kill(proc)
            self.history.op("killed", target=proc.name)
        elif kind == "cut":
            self.history.op("fault", **record)
            self.proxy.cut()
        elif kind in ("lose_reply", "lose_request", "delayed_retry"):
            lose = self.proxy.lose_reply if fault.params["action"] == "lose_reply" else self.proxy.lose_request
            if fault.params["target"] == "bucket_insert":
                lose("insert", collection=role.QUEUE, retry_delay_s=fault.params["held_s"])
            else:
                lose(*FENCED_WRITES, collection=role.QUEUE, where=is_fenced, retry_delay_s=fault.params["held_s"])
            self.history.op("fault", **record)
        elif kind == "clock_step":
            ready = [p for p in self.procs.values() if p.role in CLOCK_STEPPED and self.ready(p)]
            if not ready:
                self.tally.skipped[kind] += 1
                return
            victim = sorted(ready, key=lambda p: p.name)[int(fault.params["pick"] * len(ready))]
            (self.run_dir / "clock" / victim.name).write_text(str(fault.params["step_s"]))
            self.history.op("fault", **record, target=victim.name)
            os.kill(victim.pid, signal.SIGUSR1)
        elif kind in OUTAGES:
            if self.server.test_server is None:
                self.tally.skipped[kind] += 1
                return
            began = self.history.stamp()
            started = time.monotonic()
            if kind == "restart":
                self.server.test_server.restart()
                self.server.generation += 1
                self.tally.restart_s.append(round(time.monotonic() - started, 2))
            else:
                self.server.stall()
                try:
                    time.sleep(fault.params["seconds"])
                finally:
                    self.server.resume()
            # Written once over, stamped with its start: ``ms`` is how long the server was away.
            self.history.op("fault", **{**record, "kind": OUTAGES[kind]}, ms=(time.monotonic() - started) * 1000,
                            **began)
        elif kind in ("slow_start", "slow_end"):
            slow = self.run_dir / "slow"
            slow.touch() if kind == "slow_start" else slow.unlink(missing_ok=True)
            self.history.op("fault", **record)
        self.tally.injected[kind] += 1

    # -- resources: on a thread of their own, so that a slow count never holds a fault back --------------------

    def _sample_loop(self) -> None:
        while not self._sampling_done.wait(SAMPLE_S):
            if not self.server.stalled:
                self.sample()

    def sample(self) -> None:
        """One sample of every resource: the processes' RSS, the server's figures, the collections."""
        h = self.history
        for proc in list(self.procs.values()):
            with contextlib.suppress(psutil.Error):
                h.sample("rss_bytes", psutil.Process(proc.pid).memory_info().rss, proc=proc.name)
        if self.server.pid is not None:
            with contextlib.suppress(psutil.Error):
                h.sample("rss_bytes", psutil.Process(self.server.pid).memory_info().rss, server=self.server.process)
        h.sample("rss_bytes", psutil.Process().memory_info().rss)
        try:
            self._sample_server()
        except PyMongoError as exc:  # a restart: the next sample
            print(f"soak: sample skipped: {type(exc).__name__}", file=sys.stderr)

    def _sample_server(self) -> None:
        h = self.history
        admin = self.sampler_client.admin
        with contextlib.suppress(PyMongoError):
            status = admin.command("serverStatus")
            for name, value in (status.get("connections") or {}).items():
                if isinstance(value, (int, float)):
                    h.sample(f"connections.{name}", value, server=self.server.process)
            cursors = ((status.get("metrics") or {}).get("cursor") or {}).get("open") or {}
            if isinstance(cursors.get("total"), (int, float)):
                h.sample("cursors.open", cursors["total"], server=self.server.process)
        with contextlib.suppress(PyMongoError):
            ops = list(admin.aggregate([{"$currentOp": {"allUsers": True, "idleCursors": True}}]))
            h.sample("connections.current_ops", len(ops), server=self.server.process)
            h.sample("cursors.idle", sum(op.get("type") == "idleCursor" for op in ops), server=self.server.process)
        with contextlib.suppress(PyMongoError):
            oplog = self.sampler_client.local.command("collStats", "oplog.rs")
            h.sample("server.oplog.count", oplog.get("count", 0), server="server")
            h.sample("server.oplog.size_mb", oplog.get("size", 0) / 2**20, server="server")
        db = self.sampler_client[self.db_name]
        for name in db.list_collection_names():
            if name not in QUEUES:
                h.sample(f"docs.{name}", db[name].estimated_document_count(), server="server")
                continue
            # One pass over the bucket collection: buckets and tombstones (``fin``), and the backlog.
            rows = {r["_id"]: r for r in db[name].aggregate([{"$group": {
                "_id": {"$cond": [{"$ifNull": ["$fin", False]}, "tombstones", "buckets"]},
                "docs": {"$sum": 1}, "messages": {"$sum": UNDONE}}}])}
            for kind in ("buckets", "tombstones"):
                h.sample(f"docs.{name}.{kind}", rows.get(kind, {}).get("docs", 0), server="server")
            h.sample(f"backlog.{name}", rows.get("buckets", {}).get("messages", 0), server="server")

    def progress(self, phase: str, started: float) -> None:
        """A progress line on stderr every ``PROGRESS_S``."""
        now = time.monotonic()
        if now - self._last_progress < PROGRESS_S:
            return
        self._last_progress = now
        print(f"soak {now - started:6.0f}s {phase}: faults {sum(self.tally.injected.values())} "
              f"({', '.join(f'{k} {v}' for k, v in sorted(self.tally.injected.items()))}) | processes "
              f"{len(self.procs)} | errors {len(self.tally.errors)}", file=sys.stderr, flush=True)

    def observe_endings(self) -> None:
        """After the run: each dead letter and quarantined message, as the server has it, into the runner's history
        as ``dead`` (``observed``: where it was found): the ends of messages whose deciding process was killed
        before it could say (a cancel acknowledged to no one)."""
        db = self.client[self.db_name]
        for queue in QUEUES:
            for doc in db[f"{queue}.dead"].find({}, {"error": 1, "cancelled": 1}):
                reason = "cancelled" if doc.get("cancelled") else str(doc.get("error"))[:120]
                self.history.op("dead", queue=queue, id=str(doc["_id"]), reason=reason, observed="dead_letters")
            for doc in db[f"{queue}.quarantine"].find({"kind": "message"}, {"reason": 1}):
                self.history.op("dead", queue=queue, id=str(doc["_id"]), reason=str(doc.get("reason"))[:120],
                                observed="quarantine")

    def close(self) -> None:
        """Stop the sampler, resume a stalled server, kill what is left, close the proxy and clients."""
        self._sampling_done.set()
        if self._sampler.is_alive():
            self._sampler.join(timeout=2 * SAMPLER_TIMEOUT_MS / 1000 + SAMPLE_S)
        self.server.resume()
        self.kill_all()
        self.proxy.stop()
        self.history.close()
        self.client.close()
        self.sampler_client.close()


# -- the server, the run directory, the verdict ----------------------------------------------------------------


@contextlib.contextmanager
def server() -> Iterator[Server]:
    """The server of ``BUCKETQ_MONGODB_URI``, or a test server of our own on an H2 file, stopped and deleted
    afterwards."""
    from devtools.testserver import LONG_RUN_OPLOG_WINDOW_S, TestServer

    uri = os.environ.get("BUCKETQ_MONGODB_URI")
    if uri:
        yield Server(uri)
        return
    # A JVM grows its heap towards a quarter of the machine's memory before it collects in earnest, so the test
    # server's RSS rose from 80 to 840 MiB in a two-minute run, a trend the resource check reads as growing. With
    # the heap capped, RSS levels off, and a leak shows as what it is: collections that free nothing, then an
    # OutOfMemoryError that stops the server. (The server inherits this process's environment.)
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -Xmx{SERVER_HEAP}".strip()
    h2_dir = Path(tempfile.mkdtemp(prefix="bucketq-soak-h2-"))
    test_server = TestServer(h2_file=h2_dir / "soak", oplog_window_s=LONG_RUN_OPLOG_WINDOW_S).start()
    try:
        yield Server(test_server.uri, test_server)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(test_server.pid, signal.SIGCONT)  # a stall cut short by an exit: stop needs it running
        test_server.stop()
        shutil.rmtree(h2_dir, ignore_errors=True)


def describe(server: Server) -> dict[str, Any]:
    """The server's version and settings, for the report."""
    client: MongoClient[Any] = MongoClient(server.uri, serverSelectionTimeoutMS=10_000)
    try:
        info = client.admin.command("buildInfo")
        hello = client.admin.command("isMaster")  # the test server knows no "hello"
    finally:
        client.close()
    return {"kind": "BUCKETQ_MONGODB_URI" if server.test_server is None else "mongo-java-server (H2 file backend)",
            "uri": redact(server.uri, server.uri),
            "version": info.get("version"), "max_wire_version": hello.get("maxWireVersion"),
            "replica_set": hello.get("setName"), "restarts_and_stalls": server.test_server is not None,
            "settings": {"java_heap": SERVER_HEAP} if server.test_server is not None else {},
            "queue_options": role.queue_options()}


def verdict(run_dir: Path, *, plot: bool, embedded: bool) -> tuple[dict[str, Any], list[str]]:
    """The checker's verdict per rule and the resource trends, as report fields, and the failures they show
    (``checker missing`` while ``tests.soak.checker`` or ``tests.soak.trends`` is not there). With ``plot`` the
    trends are drawn into ``<run>/resources.png``. On the ``embedded`` test server the cursor counts are reported,
    not judged: mongo-java-server never closes the cursors of a client that died (a SIGKILLed worker leaves two),
    where MongoDB times them out after ten minutes."""
    try:
        from tests.soak import checker, trends
    except ImportError as exc:
        return {"checker": f"checker missing ({exc})"}, ["checker missing"]
    result = checker.check(run_dir)
    rules = {r.name: {"cases": r.cases, "violations": len(r.violations), "passed": r.passed} for r in result.rules}
    failures = [f"rule {r.name}: {len(r.violations)} violations, {r.cases} cases" for r in result.rules
                if not r.passed]
    found = trends.check_trends(run_dir, (*trends.NOT_JUDGED, "cursors.") if embedded else trends.NOT_JUDGED,
                                settle_s=DOCUMENTS_SETTLE_S)
    growing = trends.growing(found)
    failures += [f"trend {t.proc} {t.metric}: grows from {t.second_quarter:.4g} to {t.last_quarter:.4g}"
                 for t in growing]
    out: dict[str, Any] = {
        "rules": rules,
        "violations": [v.to_json() for r in result.rules for v in r.violations][:VIOLATIONS_SHOWN],
        "trends": {"series": len(found), "judged": sum(t.judged for t in found),
                   "growing": [t.to_json() for t in growing]},
    }
    if plot:
        out["plot"] = str(run_dir / "resources.png")
        trends.plot(run_dir, out["plot"])
    return out, failures


def run(seed: int, minutes: float, keep_results: bool) -> dict[str, Any]:
    """One soak run; the closing report (also written to ``<run>/report.json``)."""
    started = time.monotonic()
    run_dir = RESULTS / str(seed) if keep_results else Path(tempfile.mkdtemp(prefix="bucketq-soak-"))
    if keep_results:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
    report: dict[str, Any] = {"ok": False, "seed": seed, "minutes": minutes}
    try:
        with server() as srv:
            report["server"] = describe(srv)
            runner = Runner(seed, minutes, run_dir, srv)
            try:
                report["run"] = runner.run()
            finally:
                runner.close()
                report["faults"] = {"injected": dict(runner.tally.injected), "skipped": dict(runner.tally.skipped),
                                    "restart_s": runner.tally.restart_s}
                report["errors"] = runner.tally.errors[:ERRORS_SHOWN]
                errors = len(runner.tally.errors)
                report["generations"] = {f"{r}-{i}": g for (r, i), g in sorted(runner.generations.items())}
        found, failures = verdict(run_dir, plot=keep_results, embedded=not os.environ.get("BUCKETQ_MONGODB_URI"))
        report.update(found)
        failures += [f"process errors: {errors}"] if errors else []
        if not report["run"]["drained"]:
            failures.append("not drained")
        report["failures"] = failures
        report["ok"] = not failures
        report["history"] = str(run_dir / "history") if keep_results else None
        report["wall_s"] = round(time.monotonic() - started, 1)
        (run_dir / "report.json").write_text(json.dumps(report, default=str))
        return report
    finally:
        if not keep_results:
            shutil.rmtree(run_dir, ignore_errors=True)

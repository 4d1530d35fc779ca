"""The stream part of the stress run: writers push to one stream while the readers of group
``crashy`` are SIGKILLed at random and replaced, a group ``steady`` reads the same stream undisturbed, and one
writer is SIGKILLed mid-run (it may leave allocated sequences that never land: holes, turned gaps after
``gap_wait``). At the end both groups must have read and acked exactly the written messages.

Report keys (under ``"stream"`` in the harness's JSON):

    written               pushes that returned a position (the writer logged ``ok``)
    unacked_pushes_read   messages of a killed writer's last pushes, which never returned, read anyway (allowed)
    groups                per group: acked (distinct), lost, duplicated, duplicates_explained, unexpected, lag
    lost                  written and not acked by some group                               must be 0
    acked_in_flight_at_kill  messages whose ack() was running when their reader was SIGKILLed, and that no other
                          reader acked after: the ack may have been written (the last message of a bucket
                          finishes it at once), so they are not counted lost; at most one per reader kill
    unexpected            read but never pushed, or read at another position than push returned   must be 0
    duplicated            acked more than once in a group outside the crash window             must be 0
    duplicates_explained  acked again because the first ack was not yet written when its reader was killed or
                          lost its lease (docs/FORMAT.md, Delivery to a group): the ack was logged, and no later
                          ``flush()`` of that reader confirmed it
    reader_kills, writer_kills, gaps (gap markers at the end), seconds, ok
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from tests.stress.common import die_with_parent

ROOT = Path(__file__).resolve().parent.parent.parent
STREAM = "events"
GROUPS = ("crashy", "steady")
IDLE_S = 8.0  # a reader exits after this long without a message: more than gap_wait plus a lease
DEADLINE_S = 240.0


@dataclass
class StreamConfig:
    writers: int = 2
    messages_per_writer: int = 1500
    readers: int = 3  # in group crashy; group steady has one
    reader_kills: int = 6
    writer_kills: int = 1
    write_seconds: float = 20.0
    seed: int = 1
    keep: bool = False


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    group: str = ""
    writer: int = -1
    gen: int = -1


class StreamRun:
    def __init__(self, uri: str, config: StreamConfig) -> None:
        self.uri = uri
        self.c = config
        self.rng = random.Random(config.seed)
        self.db = f"bq_stress_stream_{uuid.uuid4().hex[:8]}"
        self.work = Path(tempfile.mkdtemp(prefix="bucketq-stress-stream-"))
        self.procs: list[_Proc] = []
        self.done: list[_Proc] = []
        self.killed: set[int] = set()
        self.reader_kills = 0
        self.writer_kills = 0

    def _spawn(self, role: str, log: Path, args: list[str], **fields: Any) -> _Proc:
        err = open(self.work / f"{log.stem}.stderr", "ab")
        cmd = [sys.executable, "-m", "tests.stress.stream_proc", role, self.uri, self.db, STREAM, "--log", str(log),
               *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        popen = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=err, preexec_fn=die_with_parent)
        err.close()
        proc = _Proc(popen, log, **fields)
        self.procs.append(proc)
        return proc

    def _writer(self, w: int, gen: int, count: int) -> _Proc:
        rate = self.c.messages_per_writer / self.c.write_seconds if self.c.write_seconds else 0.0
        return self._spawn("writer", self.work / f"writer{w}.gen{gen}.log",
                           ["--writer", str(w), "--gen", str(gen), "--count", str(count), "--rate", f"{rate:.2f}"],
                           writer=w, gen=gen)

    def _reader(self, group: str) -> _Proc:
        log = self.work / f"reader.{group}.{len(self.procs) + len(self.done)}.log"
        return self._spawn("reader", log, ["--group", group, "--idle", str(IDLE_S)], group=group)

    def _kill(self, proc: _Proc) -> bool:
        if proc.popen.poll() is not None:
            return False
        os.kill(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()
        self.killed.add(proc.popen.pid)
        return True

    def _reap(self) -> None:
        for proc in [p for p in self.procs if p.popen.poll() is not None]:
            self.procs.remove(proc)
            self.done.append(proc)

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            return self._run(started)
        finally:
            for proc in self.procs:
                self._kill(proc)
            MongoClient(self.uri).drop_database(self.db) if not self.c.keep else None
            if not self.c.keep:
                shutil.rmtree(self.work, ignore_errors=True)

    def _run(self, started: float) -> dict[str, Any]:
        for w in range(self.c.writers):
            self._writer(w, 0, self.c.messages_per_writer)
        for _ in range(self.c.readers):
            self._reader("crashy")
        self._reader("steady")
        write_s = self.c.write_seconds or 5.0
        kill_times = sorted(self.rng.uniform(1.0, write_s) for _ in range(self.c.reader_kills))
        writer_kill_times = sorted(self.rng.uniform(2.0, write_s * 0.8) for _ in range(self.c.writer_kills))
        errors: list[str] = []
        while True:
            now = time.monotonic() - started
            if now > DEADLINE_S:
                errors.append(f"stream run not finished after {DEADLINE_S:.0f}s")
                break
            if kill_times and now >= kill_times[0]:
                kill_times.pop(0)
                victims = [p for p in self.procs if p.group == "crashy"]
                if victims and self._kill(self.rng.choice(victims)):
                    self.reader_kills += 1
            if writer_kill_times and now >= writer_kill_times[0]:
                writer_kill_times.pop(0)
                victims = [p for p in self.procs if p.writer >= 0]
                if victims:
                    victim = self.rng.choice(victims)
                    if self._kill(victim):
                        self.writer_kills += 1
                        left = self.c.messages_per_writer - sum(
                            len(_oks(p.log)) for p in [*self.done, *self.procs] if p.writer == victim.writer)
                        self._writer(victim.writer, victim.gen + 1, max(0, left))
            self._reap()
            for proc in list(self.done):
                if proc.popen.returncode not in (0, -signal.SIGKILL):
                    errors.append(f"{proc.log.stem} exited with {proc.popen.returncode}: {_tail(proc)}")
                    self.done.remove(proc)
            writing = any(p.writer >= 0 for p in self.procs)
            for group in GROUPS:  # keep each group's readers going until everything is read
                active = [p for p in self.procs if p.group == group]
                wanted = self.c.readers if group == "crashy" and (writing or kill_times) else 1
                if len(active) < wanted and (writing or not self._caught_up(group)):
                    self._reader(group)
            if not self.procs:
                break
            time.sleep(0.1)
        return self._account(time.monotonic() - started, errors)

    def _caught_up(self, group: str) -> bool:
        client: MongoClient = MongoClient(self.uri)
        try:
            db = client[self.db]
            state = db[f"{STREAM}.positions"].find_one({"_id": group})
            counter = db[f"{STREAM}.seq"].find_one({"_id": "seq"}) or {}
            return state is not None and state["s"] > counter.get("last", 0)
        finally:
            client.close()

    def _account(self, seconds: float, errors: list[str]) -> dict[str, Any]:
        written: dict[str, str] = {}
        attempted_gens: set[tuple[str, str]] = set()
        for proc in self.done:
            if proc.writer >= 0:
                written.update(_oks(proc.log))
                attempted_gens.add((str(proc.writer), str(proc.gen)))
        killed_writers = {(str(p.writer), str(p.gen)) for p in self.done if p.writer >= 0
                          and p.popen.pid in self.killed}
        groups: dict[str, Any] = {}
        unacked_read: set[str] = set()
        for group in GROUPS:
            acks: Counter[str] = Counter()
            unconfirmed: Counter[str] = Counter()
            unexpected = 0
            in_flight: set[str] = set()
            for proc in [p for p in self.done if p.group == group]:
                pending: list[tuple[str, int]] = []
                acking: str | None = None
                for line in (proc.log.read_text() if proc.log.exists() else "").splitlines():
                    parts = line.split()
                    acking = parts[1] if parts[0] == "d" else None
                    if parts[0] == "a":
                        ident, position = parts[1], parts[2]
                        acks[ident] += 1
                        if ident in written and written[ident] != position:
                            unexpected += 1
                        elif ident not in written:
                            w, g, _ = ident.split(".")
                            if (w, g) in killed_writers:
                                unacked_read.add(ident)
                            else:
                                unexpected += 1
                        pending.append((ident, int(position.split(":")[0])))
                    elif parts[0] == "f":
                        lost = {int(s) for s in parts[2].split(",")} if len(parts) > 2 else set()
                        unconfirmed.update(i for i, seq in pending if seq in lost)
                        pending = []
                if proc.popen.pid in self.killed:
                    unconfirmed.update(i for i, _ in pending)
                    if acking is not None:
                        in_flight.add(acking)
            extra = {i: n - 1 for i, n in acks.items() if n > 1}
            explained = sum(min(n, unconfirmed[i]) for i, n in extra.items())
            in_flight -= set(acks)
            lost = sorted(set(written) - set(acks) - in_flight)
            groups[group] = {"acked": len(acks), "acked_in_flight_at_kill": len(in_flight), "lost": len(lost),
                             "lost_examples": lost[:5],
                             "duplicated": sum(extra.values()) - explained, "duplicates_explained": explained,
                             "unexpected": unexpected, "lag_messages": self._lag(group)}
        gaps = MongoClient(self.uri)[self.db][STREAM].count_documents({"gap": True})
        report = {"written": len(written), "unacked_pushes_read": len(unacked_read), "groups": groups,
                  "reader_kills": self.reader_kills, "writer_kills": self.writer_kills, "gaps": gaps,
                  "seconds": round(seconds, 1), "errors": errors}
        for key in ("lost", "duplicated", "duplicates_explained", "unexpected"):
            report[key] = sum(g[key] for g in groups.values())
        report["ok"] = (not errors and not report["lost"] and not report["duplicated"] and not report["unexpected"]
                        and all(g["lag_messages"] == 0 and g["acked_in_flight_at_kill"] <= self.reader_kills
                                for g in groups.values()) and len(written) > 0)
        return report

    def _lag(self, group: str) -> int:
        import asyncio

        import bucketq

        async def lag() -> int:
            async with bucketq.Stream(self.uri, name=STREAM, db=self.db) as stream:
                return (await stream.stats())["groups"].get(group, {}).get("lag_messages", -1)

        return asyncio.run(lag())


_OK = re.compile(r"^ok (\S+) (\S+)$", re.M)


def _oks(log: Path) -> dict[str, str]:
    return dict(_OK.findall(log.read_text())) if log.exists() else {}


def _tail(proc: _Proc) -> str:
    err = proc.log.parent / f"{proc.log.stem}.stderr"
    return " | ".join(err.read_text().strip().splitlines()[-3:]) if err.exists() else ""


def run_streams(uri: str, config: StreamConfig) -> dict[str, Any]:
    return StreamRun(uri, config).run()

"""A Spark standalone cluster on 127.0.0.1: the Master and one Worker of the installed pyspark (``spark-class``),
on free ports, stopped by PID; and ``spark-submit`` of a script to it with the connector's jars.

pip's pyspark ships ``bin/spark-class`` and ``bin/spark-submit`` but not ``sbin/start-master.sh``: the daemons are
started by class name, as ``sbin/start-master.sh`` and ``sbin/start-worker.sh`` do.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.jars import CACHE
from devtools.testserver import free_port

LOGS = CACHE / "sparkcluster"
START_TIMEOUT_S = 90.0
LOOPBACK = "127.0.0.1"
# The driver's log as build_session sets it in local mode: warnings only (spark-submit's default logs INFO).
QUIET_LOG4J2 = Path(__file__).resolve().parent.parent / "spark" / "bucketq_spark" / "log4j2.properties"


def spark_home() -> Path:
    """The installed pyspark's directory: its ``bin/`` holds ``spark-class`` and ``spark-submit``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env() -> dict[str, str]:
    """Every daemon and driver binds and advertises the loopback address only, and runs this Python."""
    return {**os.environ, "SPARK_LOCAL_IP": LOOPBACK, "SPARK_LOCAL_HOSTNAME": LOOPBACK,
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@dataclass
class SparkCluster:
    """A Master and one Worker (``cores``, ``memory``) of the installed pyspark. ``master_url`` is what
    ``spark-submit --master`` takes; ``state()`` is the Master's JSON (workers, active and completed apps)."""

    cores: int = 2
    memory: str = "2g"
    port: int = 0
    webui_port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def work_dir(self) -> Path:
        """The worker's scratch: the applications' jars and executor logs, deleted by ``stop()``."""
        return LOGS / f"work-{self.port}"

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.webui_port}/json/", timeout=5) as reply:
            return json.load(reply)

    def start(self) -> SparkCluster:
        self.port = self.port or free_port()
        self.webui_port = self.webui_port or free_port()
        LOGS.mkdir(parents=True, exist_ok=True)
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(self.port),
                               "--webui-port", str(self.webui_port)])
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.master_url, "--host", LOOPBACK,
                               "--webui-port", str(free_port()), "--cores", str(self.cores), "--memory", self.memory,
                               "--work-dir", str(self.work_dir)])
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if any(w.get("state") == "ALIVE" for w in self.state().get("workers", [])):
                    return self
            except OSError:
                pass
            for role, process in self._processes.items():
                if process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"the Spark {role} exited with {process.returncode} (see {LOGS})")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"no Spark worker registered with the master within {START_TIMEOUT_S:.0f} s (see {LOGS})")

    def _spawn(self, role: str, args: list[str]) -> None:
        log = (LOGS / f"{role}-{self.port}.log").open("ab")
        # A session (and process group) of its own: a Ctrl-C to the caller does not reach it, and stop() ends the
        # worker's executors, which are in its group, with it.
        process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        log.close()
        self._processes[role] = process
        self.pids[role] = process.pid

    def executor_pids(self) -> list[int]:
        """The worker's executor JVMs running now (its process group, less the worker)."""
        worker = self.pids.get("worker")
        if worker is None:
            return []
        # -ww: the executor's class name comes after its whole classpath, past any column limit
        out = subprocess.run(["ps", "-ww", "-e", "-o", "pid=,pgid=,args="], capture_output=True, text=True).stdout
        rows = [line.split(None, 2) for line in out.splitlines()]
        return [int(pid) for pid, pgid, args in (r for r in rows if len(r) == 3)
                if int(pgid) == worker and int(pid) != worker and "CoarseGrainedExecutorBackend" in args]

    def stop(self) -> None:
        """The worker (with its executors), then the master: SIGTERM to each process group, SIGKILL if it lingers;
        then the worker's scratch directory goes (the daemons' own logs stay, as the test server's do)."""
        for role in ("worker", "master"):
            process = self._processes.pop(role, None)
            self.pids.pop(role, None)
            if process is None:
                continue
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            _signal_group(process.pid, signal.SIGKILL)  # an executor that outlived its worker
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def submit_command(master_url: str, jars: Sequence[Path], script: Path | str, args: Sequence[str], *,
                   name: str = "bucketq", conf: Mapping[str, str] | None = None) -> list[str]:
    """The ``spark-submit`` line that runs ``script`` on ``master_url`` with the connector's ``jars`` on the driver
    and the executors (``--jars``; none: left out), the driver on the loopback address, logging warnings only."""
    settings = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK, **(conf or {})}
    line = [str(spark_home() / "bin" / "spark-submit"), "--master", master_url, "--name", name,
            "--driver-java-options", f"-Dlog4j2.configurationFile={QUIET_LOG4J2.as_uri()}"]
    if jars:
        line += ["--jars", ",".join(str(j) for j in jars)]
    for key, value in settings.items():
        line += ["--conf", f"{key}={value}"]
    return [*line, str(script), *args]


def submit(command: Sequence[str], **popen: Any) -> subprocess.Popen[str]:
    """Start ``spark-submit`` (``submit_command``) with the cluster's environment; the caller waits for it."""
    return subprocess.Popen(list(command), env=_env(), text=True, **popen)

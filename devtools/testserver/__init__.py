"""The embedded test server: mongo-java-server on 127.0.0.1, on a free port, stopped by PID.

``TestServer`` starts one and stops it; ``python -m devtools.testserver start|stop|status`` manages one
long-lived dev server recorded in ``.cache/devserver.json``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.jars import CACHE, ensure_jars

HERE = Path(__file__).resolve().parent
CLASSES = CACHE / "testserver" / "classes"
LOGS = CACHE / "testserver" / "logs"
START_TIMEOUT_S = 60.0
# The oplog window of the long runs' servers (the stress and soak runs: ``TestServer.oplog_window_s``). Uncapped,
# every change-stream getMore reads all of a run's writes: a stress run with an inbox entry per message slowed the
# server until a ping took 25 s. Far longer than any stream of bucketq goes unread (``wakeup.FEED_REST_MAX_S``).
LONG_RUN_OPLOG_WINDOW_S = 120


def free_port() -> int:
    """A loopback port free now (bound, read, closed), for a server of ours to listen on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _classpath() -> str:
    jars = ensure_jars("testserver")
    source = HERE / "Launcher.java"
    compiled = CLASSES / "Launcher.class"
    if not compiled.exists() or compiled.stat().st_mtime < source.stat().st_mtime:
        CLASSES.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["javac", "-nowarn", "-d", str(CLASSES), "-cp", os.pathsep.join(map(str, jars)), str(source)],
            check=True,
        )
    return os.pathsep.join([str(CLASSES), *map(str, jars)])


@dataclass
class TestServer:
    """One mongo-java-server process. ``h2_file`` selects the H2 file backend (data survives restarts).

    It reports MongoDB 4.4 (wire version 9), which pymongo 4.13 to 4.20 accept (Launcher.java lists what that
    changes and why the server backs it); ``shipped_handshake`` keeps mongo-java-server's own wire version 8,
    which pymongo 4.18 and later refuse."""

    __test__ = False  # not a pytest test class

    h2_file: Path | None = None
    port: int = 0
    outlive_parent: bool = False  # the dev server outlives the command that starts it; others die with theirs
    shipped_handshake: bool = False
    oplog_window_s: int = 0  # > 0: oplog entries older than this are deleted (Launcher.java); 0: kept forever
    pid: int | None = None
    _process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/"

    def start(self) -> TestServer:
        classpath = _classpath()
        if not self.port:
            self.port = free_port()
        LOGS.mkdir(parents=True, exist_ok=True)
        log = (LOGS / f"{self.port}.log").open("ab")
        cmd = ["java", "-Xss4m", "-cp", classpath]
        if not self.outlive_parent:
            cmd.append("-Dbucketq.exitOnStdinEof=true")
        if self.shipped_handshake:
            cmd.append("-Dbucketq.shippedHandshake=true")
        if self.oplog_window_s:
            cmd.append(f"-Dbucketq.oplogWindowS={self.oplog_window_s}")
        cmd += ["Launcher", str(self.port)]
        if self.h2_file is not None:
            cmd.append(str(self.h2_file))
        # A session of its own, so that a Ctrl-C to the test run does not reach it before we stop it; its
        # stdin is a pipe from us, so it exits by itself if we die without stopping it.
        self._process = subprocess.Popen(cmd, stdin=subprocess.PIPE if not self.outlive_parent else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        log.close()
        self.pid = self._process.pid
        assert self._process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = self._process.stdout.readline().decode()
        if not line.startswith("listening") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"test server did not start (see {LOGS / f'{self.port}.log'}): {line!r}")
        return self

    def stop(self) -> None:
        """Stop the server by its PID: SIGTERM, then SIGKILL if it lingers."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe:
                    pipe.close()
        else:
            _wait_gone(self.pid)
        self.pid = None
        self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port (with the H2 backend the data is still there)."""
        self.stop()
        self.start()

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)

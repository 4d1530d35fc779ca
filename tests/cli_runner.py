"""The ``bucketq`` console script run as an operator runs it, each command in a process of its own: the ``bq`` fixture
(a pytest plugin, loaded by conftest) and the checks of what a run printed, for the CLI's test files.

``bq`` runs ``python -m bucketq.cli`` forked from a zygote (tests/entrypoints/cli_zygote.py), one a session (a
pytest-xdist worker is a session), started at the first command and stopped at the end: the child of a process that
has imported ``bucketq.cli`` and started nothing, so each command costs its own work and not bucketq's import
(0.4 s of CPU, most of a CLI test). It gets the arguments, environment, working directory and stdio a subprocess
would, and exits as the interpreter does. Where the zygote cannot give a fresh interpreter's behaviour (an
environment that changes how the interpreter starts, an import that warns or starts threads, a platform without
``fork`` and ``pidfd_open``), the command runs as a subprocess. The tests of the interpreter's own start (the
installed script, ``python -m``, signals) start their processes themselves.
"""

from __future__ import annotations

import json
import locale
import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BQ = [sys.executable, "-m", "bucketq.cli"]
Run = Callable[..., subprocess.CompletedProcess]
ZYGOTE = [sys.executable, "-m", "tests.entrypoints.cli_zygote"]
# What the interpreter reads of the environment as it starts (flags, encodings, locale, path): a forked command has
# the zygote's, so a command given other values runs as a subprocess
STARTUP_ENV = ("PYTHON", "LC_", "LANG")


def cli_env(uri: str | None) -> dict[str, str]:
    """This process's environment with ``BUCKETQ_MONGODB_URI`` set to ``uri`` (or unset, given None)."""
    env = {k: v for k, v in os.environ.items() if k != "BUCKETQ_MONGODB_URI"}
    if uri is not None:
        env["BUCKETQ_MONGODB_URI"] = uri
    return env


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that the interpreter reads as it starts."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_ENV)}


class Zygote:
    """Runs CLI commands forked from a zygote process (tests/entrypoints/cli_zygote.py), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._env: dict[str, str] = {}
        self.refused: str | None = None if hasattr(os, "pidfd_open") else "no os.pidfd_open on this platform"

    def run(self, args: list[str], *, input: str | None, env: dict[str, str], cwd: Path,
            timeout: float) -> subprocess.CompletedProcess:
        """``subprocess.run([*BQ, *args], capture_output=True, text=True, ...)``, forked from the zygote."""
        argv = [*BQ, *args]
        control = self._started()
        if control is None or startup_env(env) != startup_env(self._env):
            return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=env,
                                  cwd=cwd, stdin=None if input is not None else subprocess.DEVNULL)
        encoding = locale.getpreferredencoding(False)  # subprocess's text mode
        caller, warden = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDWR), None)
        try:
            request = json.dumps({"args": args, "env": env, "cwd": str(cwd)}).encode()
            with self._lock:
                socket.send_fds(control, [request], [warden.fileno(), in_r, out_w, err_w])
        except BaseException:
            for fd in (out_r, err_r, *([] if in_w is None else [in_w])):
                os.close(fd)
            caller.close()
            raise
        finally:  # the command's ends: the warden has them now
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            warden.close()
        with caller:  # closing it before the command ends kills the command
            deadline = time.monotonic() + timeout
            out, err, in_time = communicate(in_w, None if input is None else input.encode(encoding), out_r, err_r,
                                            deadline)
            try:
                if in_time:
                    returncode = exit_of(caller, max(deadline - time.monotonic(), 0.1))
            except TimeoutError:  # the command closed its output but did not end
                in_time = False
            if not in_time:  # as subprocess.run: kill the command, then raise
                caller.sendall(b"kill")
                exit_of(caller, None)
                raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(argv, returncode, decoded(out, encoding), decoded(err, encoding))

    def _started(self) -> socket.socket | None:
        """The zygote's control socket, starting the zygote if need be; None if it refused (``refused`` says why)."""
        with self._lock:
            if self._control is None and self.refused is None:
                self._env = cli_env(None)
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                with theirs:
                    # a session of its own: a Ctrl-C in the terminal reaches pytest, which ends the commands
                    self._proc = subprocess.Popen([*ZYGOTE, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                                  cwd=REPO, env=self._env, stdin=subprocess.DEVNULL,
                                                  stdout=subprocess.DEVNULL, start_new_session=True)
                ours.settimeout(60)
                try:
                    ready = ours.recv(1 << 20)
                except TimeoutError:
                    ready = b""
                ours.settimeout(None)
                self.refused = json.loads(ready)["refused"] if ready else "the zygote ended or hung before it was ready"
                if self.refused is None:
                    self._control = ours
                else:
                    ours.close()
                    self.stop()
                    warnings.warn(f"the CLI tests run as subprocesses: {self.refused}", stacklevel=1)
            return self._control

    def stop(self) -> None:
        """End the zygote (closing its socket ends it; by its pid if it does not) and wait for it."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def communicate(in_w: int | None, data: bytes | None, out_r: int, err_r: int,
                deadline: float) -> tuple[bytes, bytes, bool]:
    """Feed ``data`` to ``in_w`` and read ``out_r`` and ``err_r`` to their ends, as subprocess's communicate does,
    closing the descriptors: what was read of stdout, of stderr, and whether that was before ``deadline``."""
    out: list[bytes] = []
    err: list[bytes] = []
    with selectors.PollSelector() as selector:
        selector.register(out_r, selectors.EVENT_READ, out)
        selector.register(err_r, selectors.EVENT_READ, err)
        if in_w is not None and data:
            selector.register(in_w, selectors.EVENT_WRITE)
        elif in_w is not None:
            os.close(in_w)
        offset = 0
        try:
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return b"".join(out), b"".join(err), False
                for key, _ in selector.select(remaining):
                    if key.fd == in_w and data is not None:
                        try:
                            offset += os.write(in_w, data[offset:offset + select.PIPE_BUF])
                        except BrokenPipeError:
                            offset = len(data)
                        if offset >= len(data):
                            selector.unregister(in_w)
                            os.close(in_w)
                    else:
                        chunk = os.read(key.fd, 32768)
                        if chunk:
                            key.data.append(chunk)
                        else:
                            selector.unregister(key.fd)
                            os.close(key.fd)
        finally:
            for key in list(selector.get_map().values()):
                os.close(key.fd)
    return b"".join(out), b"".join(err), True


def exit_of(caller: socket.socket, timeout: float | None) -> int:
    """The exit code the warden sends once the command has ended (and been reaped)."""
    caller.settimeout(timeout)
    received = b""
    while not received.endswith(b"\n"):
        chunk = caller.recv(64)
        if not chunk:
            raise RuntimeError("the CLI zygote's warden ended without the command's exit code")
        received += chunk
    return int(received)


def decoded(data: bytes, encoding: str) -> str:
    """``data`` decoded as subprocess's text mode does (universal newlines)."""
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


@pytest.fixture(scope="session")
def cli_zygote() -> Iterator[Zygote]:
    """The session's zygote of CLI commands, started by the first one, stopped at the end."""
    zygote = Zygote()
    yield zygote
    zygote.stop()


@pytest.fixture
def bq(mongo_uri: str, db_name: str, sync_db: Any, cli_zygote: Zygote) -> Run:  # sync_db: dropped afterwards
    """``bq("stats", "events", "--json")`` runs the CLI on the test's database; ``input=`` feeds stdin."""
    def run(*args: str, input: str | None = None, uri: str | None = mongo_uri, db: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
        return cli_zygote.run([*args, *(["--db", db_name] if db else [])], input=input, env=cli_env(uri), cwd=REPO,
                              timeout=timeout)
    return run


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``result``, after checking that the run succeeded without a traceback."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The error message of a run that failed as a user should see it: one ``Error: `` line holding every fragment,
    no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip()
    assert message.startswith("Error: ") and "\n" not in message, result.stderr
    for fragment in fragments:
        assert fragment in message
    return message


def jsonl(text: str) -> list:
    """The JSON documents of ``text``, one a line (a ``--json`` listing)."""
    return [json.loads(line) for line in text.splitlines()]

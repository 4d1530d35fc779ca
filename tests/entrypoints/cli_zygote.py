"""The CLI's zygote, for the ``bq`` fixture (tests/cli_runner.py): a process that imports ``bucketq.cli`` once, then
forks a child for each command, which runs the command as ``python -m bucketq.cli`` does, without importing bucketq
again (0.4 s of CPU a command, most of what a CLI test costs).

``python -m tests.entrypoints.cli_zygote FD``, FD being this end of a SOCK_SEQPACKET socket pair. The zygote first
sends a JSON ``{"refused": null}``, or the reason why it is not fit to fork commands from (then it ends). Each
message it receives after that is one command: a JSON ``{"args", "env", "cwd"}`` carrying four file descriptors: a
stream socket to the caller, and the command's stdin, stdout and stderr. For each, the zygote forks a warden, which
forks the command, waits for it and sends its exit code (``returncode`` as subprocess gives it) on the stream
socket. If the caller writes to that socket or closes it first (a timeout, an interrupted test), the warden kills
the command before it reaps it: no pid is signalled after it may have been reused, and no command outlives its
caller. The zygote ends when its caller closes the socket pair.
"""

from __future__ import annotations

import atexit
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
import warnings
from typing import Any, NoReturn

MAX_MESSAGE = 1 << 20  # a command's JSON (the environment is most of it)


def prepare() -> str | None:
    """Import the CLI; None if the zygote may fork commands from here, else why not."""
    try:
        with warnings.catch_warnings(record=True) as caught:  # under the filters a real run has
            importlib.import_module("bucketq.cli")
    except BaseException:  # a broken package: a real run shows its traceback, which the caller's own run will show
        return "importing bucketq.cli failed:\n" + traceback.format_exc()
    if caught:  # a real run prints these on every command's stderr; a forked command would not
        return "importing bucketq.cli warned: " + "; ".join(str(w.message) for w in caught)
    if threading.active_count() != 1:  # a fork copies only the forking thread
        return f"importing bucketq.cli started threads: {threading.enumerate()}"
    return None


def serve(control: socket.socket) -> None:
    while True:
        message, fds, _flags, _address = socket.recv_fds(control, MAX_MESSAGE, 4)
        reap(os.WNOHANG)  # the wardens of the commands before (their CPU time is counted as the caller's)
        if not message:  # the caller closed the socket pair: end once every command has
            reap(0)
            return
        try:
            request = json.loads(message)
            if os.fork() == 0:
                warden(request, control, *fds)
        finally:
            for fd in fds:
                os.close(fd)


def reap(options: int) -> None:
    """Wait for the wardens that have ended (``WNOHANG``), or for all (0)."""
    try:
        while os.waitpid(-1, options)[0]:
            pass
    except ChildProcessError:  # none left
        pass


def warden(request: dict[str, Any], control: socket.socket, conn_fd: int, *stdio: int) -> NoReturn:
    """Run the command in a child of its own; send its exit code on ``conn_fd``, killing it first if the caller
    wrote or hung up before it ended."""
    status = 70
    try:
        control.close()
        conn = socket.socket(fileno=conn_fd)
        pid = os.fork()
        if pid == 0:
            command(request, conn_fd, *stdio)
        for fd in stdio:
            os.close(fd)
        ended = os.pidfd_open(pid)  # readable once the command has ended
        readable, _, _ = select.select([conn.fileno(), ended], [], [])
        if ended not in readable:
            os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still the command's
        os.close(ended)
        _, wait_status = os.waitpid(pid, 0)
        try:
            conn.sendall(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
        except OSError:  # the caller is gone
            pass
        status = 0
    finally:
        os._exit(status)


def command(request: dict[str, Any], conn_fd: int, *stdio: int) -> NoReturn:
    """Be ``python -m bucketq.cli ARGS`` in ``cwd`` with ``env`` and the given stdio, to the exit code."""
    code = 1
    try:
        os.close(conn_fd)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            setattr(sys, name, standard_stream(fd, getattr(sys, name)))
            setattr(sys, f"__{name}__", getattr(sys, name))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # python -m puts the working directory first
        sys.argv = ["-m", *request["args"]]  # run_module puts the module's file first, as python -m does
        runpy.run_module("bucketq.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:  # the interpreter prints the traceback, then dies of SIGINT
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # the interpreter prints the traceback and exits with 1
        sys.excepthook(*sys.exc_info())
    finally:
        os._exit(finish(code))


def standard_stream(fd: int, zygote_own: io.TextIOWrapper) -> io.TextIOWrapper:
    """A stdin, stdout or stderr on ``fd`` as the interpreter makes it at start (pylifecycle.c's create_stdio): the
    zygote's own were made for other files (buffered by line or not, seekable or not, as their files are)."""
    buffered = not zygote_own.write_through  # PYTHONUNBUFFERED, -u
    writes = fd != 0
    buffer: Any = open(fd, "wb" if writes else "rb", buffering=-1 if buffered or not writes else 0, closefd=False)
    raw = getattr(buffer, "raw", buffer)  # unbuffered: the file itself
    raw.name = f"<{('stdin', 'stdout', 'stderr')[fd]}>"
    stream = io.TextIOWrapper(buffer, encoding=zygote_own.encoding, errors=zygote_own.errors, newline="\n",
                              line_buffering=buffered and (raw.isatty() or fd == 2), write_through=not buffered)
    stream.mode = "w" if writes else "r"  # type: ignore[misc]
    return stream


def exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter gives a ``SystemExit``: its int code, 0 for None, else 1 after printing it."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def finish(code: int) -> int:
    """What the interpreter does at exit, before ``os._exit``: wait for the threads that are not daemons, run the
    atexit functions (logging's shutdown among them), flush stdout and stderr (120 if stdout cannot be)."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            code = 120
        try:
            sys.stderr.flush()
        except Exception:
            pass
    if code < 0:  # died of a signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main() -> None:
    with socket.socket(fileno=int(sys.argv[1])) as control:
        refused = prepare()
        control.send(json.dumps({"refused": refused}).encode())
        if refused is None:
            serve(control)


if __name__ == "__main__":
    main()

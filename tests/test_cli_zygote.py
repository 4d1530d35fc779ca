"""The ``bq`` fixture's commands, forked from the CLI's zygote (tests/cli_runner.py), behave as
``python -m bucketq.cli`` run as a subprocess: same exit code, stdout and stderr; a timeout kills the command. No
server: the commands fail to reach one, or reach a socket that never answers."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.cli_runner import BQ, REPO, Zygote, cli_env

# refused at once (the CLI waits its --connect-timeout for it); the password must not be shown
UNREACHABLE = "mongodb://app:pa55-zygote@127.0.0.1:1/app"

COMMANDS = [
    (["--help"], None),
    (["--version"], None),
    (["no-such-command"], None),
    (["peek", "events", "-n", "not-a-number"], None),
    (["stats", "--uri", UNREACHABLE, "--connect-timeout", "0.3"], None),
    (["push", "events", "{not json", "--uri", UNREACHABLE, "--connect-timeout", "0.3"], None),
]


@pytest.mark.parametrize(("args", "input"), COMMANDS, ids=[" ".join(args[:2]) for args, _ in COMMANDS])
def test_a_forked_command_prints_and_exits_as_the_interpreter_run_does(cli_zygote: Zygote, args: list[str],
                                                                        input: str | None) -> None:
    env = cli_env(None)
    forked = cli_zygote.run(args, input=input, env=env, cwd=REPO, timeout=60)
    assert cli_zygote.refused is None
    real = subprocess.run([*BQ, *args], input=input, capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
                          stdin=None if input is not None else subprocess.DEVNULL)
    assert (forked.args, forked.returncode, forked.stdout, forked.stderr) == (
        real.args, real.returncode, real.stdout, real.stderr)
    assert "pa55-zygote" not in forked.stderr


def test_a_command_past_its_timeout_is_killed(cli_zygote: Zygote) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections (the backlog), never answers
        port = silent.getsockname()[1]
        uri = f"mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=120000&connectTimeoutMS=120000"
        with pytest.raises(subprocess.TimeoutExpired):
            cli_zygote.run(["stats", "--uri", uri], input=None, env=cli_env(None), cwd=REPO, timeout=1)
        connection, _ = silent.accept()
        with connection:
            connection.settimeout(60)
            while connection.recv(65536):  # the driver's hello, then the end: its process is gone
                pass


def test_a_command_with_other_interpreter_settings_runs_as_a_subprocess(cli_zygote: Zygote) -> None:
    # PYTHONVERBOSE is read as the interpreter starts: a forked command would not trace its imports
    traced = cli_zygote.run(["--version"], input=None, env={**cli_env(None), "PYTHONVERBOSE": "1"}, cwd=REPO,
                            timeout=60)
    assert traced.returncode == 0 and "import 'bucketq.cli'" in traced.stderr

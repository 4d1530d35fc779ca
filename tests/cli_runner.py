"""The ``bucketq`` console script run as an operator runs it, in a subprocess: the ``bq`` fixture (a pytest plugin,
loaded by conftest) and the checks of what a run printed, for the CLI's test files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BQ = [sys.executable, "-m", "bucketq.cli"]
Run = Callable[..., subprocess.CompletedProcess]


def cli_env(uri: str | None) -> dict[str, str]:
    """This process's environment with ``BUCKETQ_MONGODB_URI`` set to ``uri`` (or unset, given None)."""
    env = {k: v for k, v in os.environ.items() if k != "BUCKETQ_MONGODB_URI"}
    if uri is not None:
        env["BUCKETQ_MONGODB_URI"] = uri
    return env


@pytest.fixture
def bq(mongo_uri: str, db_name: str, sync_db: Any) -> Run:  # sync_db: the database is dropped afterwards
    """``bq("stats", "events", "--json")`` runs the CLI on the test's database; ``input=`` feeds stdin."""
    def run(*args: str, input: str | None = None, uri: str | None = mongo_uri, db: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
        argv = [*BQ, *args, *(["--db", db_name] if db else [])]
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=cli_env(uri),
                              cwd=REPO, stdin=None if input is not None else subprocess.DEVNULL)
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

"""A handler and worker hooks for the ``bucketq worker`` tests in tests/test_cli.py, loaded by import path
(``tests.entrypoints.cli_hooks:NAME``). Each appends one JSON line to the file named by ``BUCKETQ_TEST_OUT``."""

from __future__ import annotations

import json
import os
from typing import Any


def _write(record: dict[str, Any]) -> None:
    with open(os.environ["BUCKETQ_TEST_OUT"], "a") as out:
        out.write(json.dumps(record) + "\n")


async def fail_marked(message: Any) -> None:
    """Fails messages whose payload has ``"fail": true``; handles the others."""
    if message.payload.get("fail"):
        raise ValueError(f"refusing {message.payload['n']}")
    _write({"handled": message.payload["n"]})


def on_error(message: Any, error: BaseException) -> None:
    _write({"error": str(error), "n": message.payload["n"], "tries": message.tries})


async def after_batch(timing: Any) -> None:
    _write({"batch": timing.size, "failed": timing.failed})

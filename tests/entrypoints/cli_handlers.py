"""Handlers for the ``bucketq worker`` tests in tests/test_cli.py (run as ``tests.entrypoints.cli_handlers:NAME``)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

PASSWORD = "handler-pa55"
log = logging.getLogger(__name__)


async def record(message: Any) -> None:
    """Append the payload as one JSON line to the file named by ``BUCKETQ_TEST_OUT``, and log a line naming a
    URI with a password (which the worker's log output must not show)."""
    with open(os.environ["BUCKETQ_TEST_OUT"], "a") as out:
        out.write(json.dumps(message.payload) + "\n")
    log.info("handled a message for mongodb://app:%s@db.example/app", PASSWORD)


def record_sync(message: Any) -> None:
    """``record`` as a sync handler (run on the worker's threads), which also records its thread's name."""
    import threading

    with open(os.environ["BUCKETQ_TEST_OUT"], "a") as out:
        out.write(json.dumps({**message.payload, "thread": threading.current_thread().name}) + "\n")


NOT_A_FUNCTION = 42

"""``bucketq worker``: run a ``bucketq.Worker`` over a handler until SIGTERM or Ctrl-C, then stop gracefully.
``MODULE:HANDLER`` is loaded with the current directory importable (like uvicorn)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from typing import Any

import click

from bucketq.cli.common import CliError, Target, connection_options, log_to_stderr, open_queue, run, stop_on_signals


@click.command()
@click.argument("handler", metavar="MODULE:HANDLER")
@click.option("--queue", "-q", required=True, metavar="NAME", help="Queue to consume (it may not exist yet).")
@click.option("--concurrency", "-c", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Messages (or batches) handled at once.")
@click.option("--batch-size", type=click.IntRange(min=1), metavar="N",
              help="Call the handler with lists of up to N messages instead of one message.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@connection_options
def worker(target: Target, handler: str, queue: str, concurrency: int, batch_size: int | None,
           log_level: str) -> None:
    """Run the async function HANDLER of MODULE over the messages of a queue.

    The handler gets a Message (or, with --batch-size, a list of them); returning acknowledges, raising
    retries with backoff and, after max_attempts, dead-letters. MODULE is imported from the current
    directory or the Python path. On SIGTERM or Ctrl-C, handlers that are running finish, state is
    flushed, and the worker exits with code 0.

    \b
    Examples:
      bucketq worker myapp.tasks:handle --queue events --concurrency 8
      bucketq worker myapp.tasks:handle_batch --queue events --batch-size 100
    """
    log_to_stderr(log_level)
    function = load_handler(handler)
    run(_work(target, function, handler, queue, concurrency, batch_size))


async def _work(target: Target, function: Any, spec: str, name: str, concurrency: int,
                batch_size: int | None) -> None:
    try:
        from bucketq.worker import Worker
    except ImportError as exc:
        raise CliError(f"this bucketq has no Worker ({exc})") from None
    log = logging.getLogger("bucketq.cli")
    started = time.monotonic()
    async with open_queue(target, name, must_exist=False) as queue:
        work = Worker(queue, function, concurrency=concurrency, batch_size=batch_size)
        with stop_on_signals(work.stop):
            log.info("worker started: %s on queue %r (concurrency %d%s); stop with SIGTERM or Ctrl-C", spec, name,
                     concurrency, f", batches of {batch_size}" if batch_size else "")
            await work.run()
        log.info("worker stopped after %.1fs: %s handled, %s failed", time.monotonic() - started,
                 getattr(work, "handled", "?"), getattr(work, "failed", "?"))


def load_handler(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"handler {spec!r} must look like MODULE:HANDLER, e.g. myapp.tasks:handle")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself failed: say so in one line (the user's bug, not ours)
        raise CliError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise CliError(f"{spec} is a {type(target).__name__}, not a function")
    return target

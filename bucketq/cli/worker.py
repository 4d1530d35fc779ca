"""``bucketq worker``: run a ``bucketq.Worker`` over a handler until SIGTERM or Ctrl-C, then stop gracefully."""

from __future__ import annotations

import logging
import time
from typing import Any

import click

from bucketq.cli.common import Target, connection_options, open_queue, run
from bucketq.cli.errors import CliError, log_to_stderr
from bucketq.cli.handler import load_handler
from bucketq.cli.signals import stop_on_signals


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

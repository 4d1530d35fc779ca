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

from bucketq.cli.common import (
    BadUsage,
    CliError,
    Target,
    connection_options,
    log_options,
    log_to_stderr,
    open_queue,
    run,
    stop_on_signals,
)
from bucketq.cli.params import queue_options
from bucketq.errors import InvalidOption
from bucketq.options import QueueOptions
from bucketq.worker import DEFAULT_CONCURRENCY, Worker


@click.command()
@click.argument("handler", metavar="MODULE:HANDLER")
@click.option("--queue", "-q", required=True, metavar="NAME", help="Queue to consume (it may not exist yet).")
@click.option("--concurrency", "-c", type=click.IntRange(1, 1024), default=DEFAULT_CONCURRENCY, show_default=True,
              help="Messages (or batches) handled at once.")
@click.option("--batch-size", type=click.IntRange(min=1), metavar="N",
              help="Call the handler with lists of up to N messages instead of one message.")
@click.option("--handler-timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Cut off a handler call that runs longer; its messages are retried.")
@click.option("--threads", type=click.IntRange(1, 1024), metavar="N",
              help="A sync handler: threads it runs on (default: --concurrency).")
@click.option("--on-error", metavar="MODULE:FUNCTION",
              help="Called as FUNCTION(message, error) for every failed message (sync or async).")
@click.option("--after-batch", metavar="MODULE:FUNCTION",
              help="Called as FUNCTION(timing) after every handled message or batch (a bucketq.BatchTiming).")
@log_options
@queue_options
@connection_options
def worker(target: Target, handler: str, queue: str, concurrency: int, batch_size: int | None,
           handler_timeout: float | None, threads: int | None, on_error: str | None, after_batch: str | None,
           log_level: str,
           driver_log_level: str, queue_options: dict[str, Any]) -> None:
    """Run the function HANDLER of MODULE over the messages of a queue.

    The handler gets a Message (or, with --batch-size, a list of them); returning acknowledges, raising
    retries with backoff and, after max_attempts, dead-letters; each failure is logged as a warning with its
    traceback (at most 10 a minute, then a count). An async handler runs on the event loop; a sync one (a
    plain def) on --threads threads, and one past --handler-timeout or --drain-timeout cannot be cancelled:
    its messages are retried while it runs on. MODULE is imported from the current directory or the
    Python path. On SIGTERM or Ctrl-C, handlers that are running get --drain-timeout to finish (then they
    are cancelled and their messages retried), state is flushed, and the worker exits with code 0. Every
    queue option (--lease, --max-attempts, --dedupe, ...) is one of bucketq.QueueOptions; those not given
    keep their defaults.

    \b
    Examples:
      bucketq worker myapp.tasks:handle --queue events --concurrency 8
      bucketq worker myapp.tasks:handle_batch --queue events --batch-size 100
      bucketq worker myapp.tasks:handle -q events --lease 120 --max-attempts 10 --on-error myapp.tasks:alert
    """
    log_to_stderr(log_level, driver_log_level)
    try:
        QueueOptions(**queue_options)  # refused here, before connecting
    except InvalidOption as exc:
        raise BadUsage(f"InvalidOption: {exc}") from None
    hooks = {name: load_callable(spec, name.replace("_", "-")) for name, spec in
             (("on_error", on_error), ("after_batch", after_batch)) if spec}
    function = load_handler(handler)
    run(_work(target, function, handler, queue, queue_options,
              dict(concurrency=concurrency, batch_size=batch_size, handler_timeout=handler_timeout,
                   threads=threads, **hooks)))


async def _work(target: Target, function: Any, spec: str, name: str, queue_options: dict[str, Any],
                worker_options: dict[str, Any]) -> None:
    log = logging.getLogger("bucketq.cli")
    started = time.monotonic()
    async with open_queue(target, name, must_exist=False, **queue_options) as queue:
        work = Worker(queue, function, handle_signals=False, **worker_options)
        if await queue.paused():
            log.warning("queue %r is paused: nothing is claimed until it is resumed (bucketq resume %s)", name, name)
        with stop_on_signals(work.stop):
            log.info("worker started: %s on queue %r (concurrency %d%s); stop with SIGTERM or Ctrl-C", spec, name,
                     work.concurrency, (f", batches of {work.batch_size}" if work.batch_size else "")
                     + (f", a sync handler on {work.handler_threads.size} threads" if work.handler_threads else ""))
            await work.run()
        log.info("worker stopped after %.1fs: %s handled, %s failed", time.monotonic() - started, work.handled,
                 work.failed)


def load_handler(spec: str) -> Any:
    return load_callable(spec, "handler", "HANDLER")


def load_callable(spec: str, what: str, metavar: str = "FUNCTION") -> Any:
    """``MODULE:NAME`` imported (the current directory importable, as uvicorn does), or a one-line error."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BadUsage(f"{what} {spec!r} must look like MODULE:{metavar}, e.g. myapp.tasks:handle")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import module {module_name!r} for the {what}: {exc}") from None
    except Exception as exc:  # the module itself failed: say so in one line (the user's bug, not ours)
        raise CliError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r} (the {what})") from None
    if not callable(target):
        raise CliError(f"{spec} ({what}) is a {type(target).__name__}, not a function")
    return target

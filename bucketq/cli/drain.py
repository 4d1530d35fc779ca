"""``bucketq drain``: consume messages for debugging, printing them as JSON lines or discarding them."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import click

from bucketq.cli.common import Target, connection_options, open_queue, run
from bucketq.cli.output import to_json
from bucketq.cli.signals import stop_on_signals
from bucketq.message import Message

STOP_CHECK_S = 0.25


@click.command()
@click.argument("queue")
@click.option("--discard", is_flag=True, help="Acknowledge messages without printing them.")
@click.option("--meta", is_flag=True,
              help="Print {id, tries, enqueued_at, headers, key, payload} instead of the bare payload.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Stop after N messages.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=1.0, show_default=True, metavar="SECONDS",
              help="Stop when no message arrives for this long.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new messages until Ctrl-C or SIGTERM.")
@connection_options
def drain(target: Target, queue: str, discard: bool, meta: bool, limit: int | None, idle_timeout: float,
          follow: bool) -> None:
    """Consume ready messages of QUEUE and print each as one JSON line (or discard them).

    Each message is acknowledged after it is printed, so it is gone from the queue. Without --meta, a
    line is the bare payload, which `bucketq push` reads back. Delayed messages that are not due yet stay
    in the queue. A count goes to stderr at the end.

    \b
    Examples:
      bucketq drain events --limit 10
      bucketq drain events --meta | jq .
      bucketq drain events --discard
      bucketq drain events --follow
    """
    run(_drain(target, queue, discard=discard, meta=meta, limit=limit, idle=None if follow else idle_timeout))


async def _drain(target: Target, name: str, *, discard: bool, meta: bool, limit: int | None,
                 idle: float | None) -> None:
    started = time.monotonic()
    count = 0
    stop = asyncio.Event()
    async with open_queue(target, name) as queue:
        with stop_on_signals(stop.set):
            while (limit is None or count < limit) and not stop.is_set():
                message = await _next(queue, idle, stop)
                if message is None:
                    break
                if not discard and not _print(message, meta):
                    await message.nack(0, error="bucketq drain: stdout closed before the message was printed")
                    break
                await message.ack()
                count += 1
    click.echo(f"{'discarded' if discard else 'drained'} {count:,} message(s) from {name!r} "
               f"in {time.monotonic() - started:.2f}s", err=True)


async def _next(queue: Any, idle: float | None, stop: asyncio.Event) -> Message | None:
    """The next message, or None after ``idle`` seconds without one or once a stop signal came. Waits in short
    slices rather than cancelling a reserve, which could leave a just-claimed bucket leased."""
    deadline = None if idle is None else time.monotonic() + idle
    while not stop.is_set():
        wait = STOP_CHECK_S if deadline is None else max(0.0, min(STOP_CHECK_S, deadline - time.monotonic()))
        message = await queue.reserve(wait)
        if message is not None:
            return message
        if deadline is not None and time.monotonic() >= deadline:
            return None
    return None


def _print(message: Message, meta: bool) -> bool:
    """Write the message to stdout; False when stdout is gone (the message is then not acknowledged)."""
    value: Any = message.payload
    if meta:
        value = {"id": message.id, "tries": message.tries, "enqueued_at": message.enqueued_at,
                 "headers": message.headers, "key": message.key, "payload": message.payload}
    try:
        sys.stdout.write(to_json(value) + "\n")
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return False

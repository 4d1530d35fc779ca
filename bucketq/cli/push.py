"""``bucketq push``: JSON payloads from arguments or stdin lines into a queue, with progress and a summary."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import click
import orjson

from bucketq.cli.common import Target, connection_options, open_queue, run
from bucketq.cli.errors import CliError
from bucketq.cli.lines import read_lines
from bucketq.cli.params import DURATION
from bucketq.cli.progress import PushProgress
from bucketq.cli.pusher import Pusher
from bucketq.errors import EncodeError, InvalidOption, PayloadTooLarge


class BadInput(Exception):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")


@click.command()
@click.argument("queue")
@click.argument("payloads", nargs=-1, metavar="[JSON]...")
@click.option("--delay", type=DURATION, metavar="DURATION",
              help="Deliver the messages after this long: 90, 30s, 5m, 2h.")
@click.option("--progress/--no-progress", default=None,
              help="Force the progress bar on or off (default: on a terminal, for inputs over 1000 lines).")
@connection_options
def push(target: Target, queue: str, payloads: tuple[str, ...], delay: float | None, progress: bool | None) -> None:
    """Push JSON payloads to QUEUE, from arguments or else from stdin (one JSON value per line).

    The queue is created if it does not exist. Blank lines are skipped. Arguments are all checked before
    anything is pushed; on stdin, invalid JSON stops the command with an error naming the line, after
    pushing the lines before it (the error says how many).

    \b
    Examples:
      bucketq push events '{"user": 1}' '{"user": 2}'
      bucketq push events < events.jsonl
      bucketq drain old --limit 1000 | bucketq push new
    """
    source = _arguments(payloads) if payloads else _stdin()
    run(_push(target, queue, source, delay, PushProgress(progress, _stdin_size() if not payloads else None)))


async def _push(target: Target, name: str, source: AsyncIterator[tuple[str, Any, int]], delay: float | None,
                progress: PushProgress) -> None:
    started = time.monotonic()
    failure: BadInput | None = None
    count = 0
    async with open_queue(target, name, must_exist=False) as queue:
        pusher = Pusher(queue, delay=delay)
        try:
            async for where, payload, consumed in source:
                try:
                    await pusher.push(payload)
                except (EncodeError, PayloadTooLarge, InvalidOption) as exc:
                    raise BadInput(where, f"{type(exc).__name__}: {exc}") from None
                count += 1
                progress.update(count, consumed)
        except BadInput as exc:
            failure = exc
        finally:
            progress.stop()
            await pusher.finish()
    elapsed = time.monotonic() - started
    if failure is not None:
        raise CliError(f"{failure}; {pusher.stored} message(s) before it were pushed, none after")
    if pusher.failed:
        raise CliError(f"{pusher.failed} of {count} message(s) were not stored ({pusher.first_error}); "
                       f"{pusher.stored} were")
    rate = f", {pusher.stored / elapsed:,.0f} msg/s" if elapsed > 0 and pusher.stored >= 1000 else ""
    click.echo(f"pushed {pusher.stored:,} message(s) to {name!r} in {elapsed:.2f}s{rate}")


def _parse(where: str, text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadInput(where, f"invalid JSON ({exc})") from None


def _arguments(payloads: tuple[str, ...]) -> AsyncIterator[tuple[str, Any, int]]:
    parsed = [_parse_argument(i, text) for i, text in enumerate(payloads, 1)]  # all checked before any push

    async def gen() -> AsyncIterator[tuple[str, Any, int]]:
        for i, payload in enumerate(parsed, 1):
            yield f"argument {i}", payload, i
    return gen()


def _parse_argument(index: int, text: str) -> Any:
    try:
        return _parse(f"argument {index}", text)
    except BadInput as exc:
        raise CliError(f"{exc}; nothing was pushed") from None


async def _stdin() -> AsyncIterator[tuple[str, Any, int]]:
    if sys.stdin is None:
        raise CliError("no payloads: give JSON arguments or pipe JSON lines on stdin")
    if sys.stdin.isatty():
        click.echo("reading one JSON value per line; end with Ctrl-D", err=True)
    lineno = 0
    async for line, consumed in read_lines(sys.stdin.fileno()):
        lineno += 1
        if line.strip():
            yield f"line {lineno}", _parse(f"line {lineno}", line), consumed


def _stdin_size() -> int | None:
    """The size of stdin when it is a regular file (``< file``), for a progress bar with a percentage."""
    try:
        info = os.fstat(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None

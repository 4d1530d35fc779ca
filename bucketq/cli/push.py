"""``bucketq push``: JSON payloads from arguments or stdin lines into a queue, pipelined, with progress and a
summary. Stdin is read without blocking the event loop, so bucket writes go on while input is awaited."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import click
import orjson

from bucketq.cli.common import BadUsage, CliError, Target, connection_options, open_queue, run
from bucketq.cli.params import DURATION
from bucketq.core.format import check_group
from bucketq.core.priorities import MAX_PRIORITY
from bucketq.errors import BufferFull, EncodeError, InvalidOption, PayloadTooLarge, WriteFailed
from bucketq.queue import Queue


class BadInput(Exception):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")


@click.command()
@click.argument("queue")
@click.argument("payloads", nargs=-1, metavar="[JSON]...")
@click.option("--delay", type=DURATION, metavar="DURATION",
              help="Deliver the messages after this long: 90, 30s, 5m, 2h.")
@click.option("--group", metavar="GROUP",
              help="Push into this ordered group: delivered in push order, one at a time (no --delay).")
@click.option("--priority", type=click.IntRange(0, MAX_PRIORITY), default=0, show_default=True,
              help=f"Priority level, 0 to {MAX_PRIORITY}: consumers take higher levels first (no --group).")
@click.option("--progress/--no-progress", default=None,
              help="Force the progress bar on or off (default: on a terminal, for inputs over 1000 lines).")
@connection_options
def push(target: Target, queue: str, payloads: tuple[str, ...], delay: float | None, group: str | None,
         priority: int, progress: bool | None) -> None:
    """Push JSON payloads to QUEUE, from arguments or else from stdin (one JSON value per line).

    The queue is created if it does not exist. Blank lines are skipped. Arguments are all checked before
    anything is pushed; on stdin, invalid JSON stops the command with an error naming the line, after
    pushing the lines before it (the error says how many).

    \b
    Examples:
      bucketq push events '{"user": 1}' '{"user": 2}'
      bucketq push events < events.jsonl
      bucketq drain old --limit 1000 | bucketq push new
      bucketq push orders --group order-17 '{"step": "paid"}' '{"step": "shipped"}'
      bucketq push alerts --priority 9 '{"page": "on-call"}'
    """
    if group is not None:
        if delay is not None:
            raise click.UsageError("--group takes no --delay: a delayed message would hold back its whole group")
        if priority:
            raise click.UsageError("--group takes no --priority: a group's order comes first")
        try:
            check_group(group)
        except InvalidOption as exc:
            raise click.BadParameter(str(exc), param_hint="--group") from None
    source = _arguments(payloads) if payloads else _stdin()
    run(_push(target, queue, source, delay, PushProgress(progress, _stdin_size() if not payloads else None), group,
              priority))


async def _push(target: Target, name: str, source: AsyncIterator[tuple[str, Any, int]], delay: float | None,
                progress: PushProgress, group: str | None = None, priority: int = 0) -> None:
    started = time.monotonic()
    failure: BadInput | None = None
    count = 0
    async with open_queue(target, name, must_exist=False) as queue:
        pusher = Pusher(queue, delay=delay, group=group, priority=priority)
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
        raise BadUsage(f"{failure}; {pusher.stored} message(s) before it were pushed, none after")
    if pusher.failed:
        raise CliError(f"{pusher.failed} of {count} message(s) were not stored ({pusher.first_error}); "
                       f"{pusher.stored} were")
    rate = f", {pusher.stored / elapsed:,.0f} msg/s" if elapsed > 0 and pusher.stored >= 1000 else ""
    click.echo(f"pushed {pusher.stored:,} message(s) to {name!r} in {elapsed:.2f}s{rate}")


def _parse(where: str, text: str | bytes) -> Any:
    """The JSON value of ``text``, the stdin line or argument ``where`` names. An error gives one position: the
    column, and within ``where`` the line too when ``text`` has several (an argument may); never orjson's own
    "line 1 column 2", which counts lines of ``text`` alone."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        line = f"line {exc.lineno} " if exc.lineno > 1 else ""
        raise BadInput(f"{where}, {line}column {exc.colno}", f"invalid JSON ({exc.msg})") from None


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
        raise BadUsage(f"{exc}; nothing was pushed") from None


async def _stdin() -> AsyncIterator[tuple[str, Any, int]]:
    if sys.stdin is None:
        raise BadUsage("no payloads: give JSON arguments or pipe JSON lines on stdin")
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


# -- pipelined pushing ---------------------------------------------------------------------------------------

WINDOW = 8192  # pending pushes before waiting for the oldest; several buckets' worth


class Pusher:
    """Many pushes in flight at once, in order, with a bounded window of pending ids."""

    def __init__(self, queue: Queue, *, delay: float | None = None, group: str | None = None,
                 priority: int = 0) -> None:
        self._queue = queue
        self._delay = delay
        self._group = group
        self._priority = priority
        self._pending: deque[asyncio.Future[str]] = deque()
        self.stored = 0
        self.failed = 0
        self.first_error: BaseException | None = None

    async def push(self, payload: Any) -> None:
        """Buffer one payload (``EncodeError``/``PayloadTooLarge`` raise here); waits only to bound the window."""
        while True:
            try:
                future = self._queue.push_nowait(payload, delay=self._delay, group=self._group,
                                                 priority=self._priority)
                break
            except BufferFull:
                if not self._pending:
                    future = asyncio.ensure_future(self._queue.push(payload, delay=self._delay, group=self._group,
                                                                    priority=self._priority))
                    break
                await self._settle(self._pending.popleft())
        self._pending.append(future)
        while len(self._pending) > WINDOW:
            await self._settle(self._pending.popleft())

    async def finish(self) -> None:
        """Write what is buffered and wait for every push."""
        await self._queue.flush()
        while self._pending:
            await self._settle(self._pending.popleft())

    async def _settle(self, future: asyncio.Future[str]) -> None:
        try:
            await future
            self.stored += 1
        except WriteFailed as exc:
            self.failed += 1
            self.first_error = self.first_error or exc


# -- stdin ---------------------------------------------------------------------------------------------------

CHUNK = 1 << 16


async def read_lines(fd: int) -> AsyncIterator[tuple[bytes, int]]:
    """Yield ``(line, bytes consumed so far)`` for each line of ``fd``, the last one even without a newline."""
    buffer = bytearray()
    consumed = 0
    while chunk := await asyncio.to_thread(os.read, fd, CHUNK):
        buffer += chunk
        end = buffer.rfind(b"\n")
        if end < 0:
            continue
        complete, buffer = bytes(buffer[:end]), buffer[end + 1:]
        for line in complete.split(b"\n"):
            consumed += len(line) + 1
            yield line, consumed
    if buffer:
        yield bytes(buffer), consumed + len(buffer)


# -- progress bar --------------------------------------------------------------------------------------------

SHOW_AFTER = 1000
UPDATE_EVERY = 256


class PushProgress:
    """A progress bar on stderr for large pushes: shown on a terminal once the input passes ``SHOW_AFTER`` lines."""

    def __init__(self, enabled: bool | None, total_bytes: int | None) -> None:
        """``enabled``: True/False forces it; None shows it on a terminal for large inputs. ``total_bytes``
        (stdin is a regular file) gives a percentage; otherwise the bar pulses."""
        self._enabled = sys.stderr.isatty() if enabled is None else enabled
        self._show_after = SHOW_AFTER if enabled is None else 0
        self._total = total_bytes or None
        self._bar: Any = None
        self._task: Any = None

    def update(self, messages: int, consumed: int, *, force: bool = False) -> None:
        if not self._enabled or (messages % UPDATE_EVERY and not force):
            return
        if self._bar is None:
            if messages < self._show_after:
                return
            self._start()
        self._bar.update(self._task, completed=consumed if self._total else messages,
                         description=f"{messages:,} messages")

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("pushing {task.description}"), BarColumn(), TaskProgressColumn(),
                             TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task("", total=self._total)
        self._bar.start()

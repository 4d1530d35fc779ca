"""What every command shares: the --uri/--db options, a fail-fast connection, finding and opening queues,
running a command, its errors and stop signals.

Expected failures become one line on stderr; nothing an operator can cause prints a traceback. Exit codes: 1 for
a failure at run time (no server, an unknown queue, a refusal), 2 for bad usage, whichever check finds it: click's
(an unknown option, a value of the wrong type) or bucketq's (``InvalidOption``, a malformed id), 130 for Ctrl-C.
No message, traceback or log line shows a password: they all pass through ``hide``, which redacts the URIs of
the command line wherever they or pieces of their credentials appear (``bucketq.shell.redaction``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from pymongo import AsyncMongoClient
from pymongo.errors import (
    ConfigurationError,
    InvalidName,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from bucketq.errors import BucketqError, InvalidOption
from bucketq.queue import Queue
from bucketq.shell.compatibility import ServerRefused, as_refused
from bucketq.shell.connection import DEFAULT_DB, ServerUnreachable, client_of, unreachable
from bucketq.shell.discovery import collection_names, is_queue
from bucketq.shell.redaction import redact
from bucketq.shell.text_views import one_line

T = TypeVar("T")
URI_ENV = "BUCKETQ_MONGODB_URI"


# -- hiding credentials ---------------------------------------------------------------------------------------

_uris: list[str] = []  # the URIs of the command line being run


def remember_uris(args: Sequence[str]) -> None:
    """Note the URIs of a command line before it is parsed: ``$BUCKETQ_MONGODB_URI``, the value of ``--uri``, and
    any argument holding ``://`` (a URI typed where a queue name goes). ``hide`` hides their credentials."""
    after_uri = [value for flag, value in zip(args, args[1:], strict=False) if flag == "--uri"]
    given = [arg.removeprefix("--uri=") for arg in args if "://" in arg or arg.startswith("--uri=")]
    _uris[:] = [uri for uri in (os.environ.get(URI_ENV, ""), *after_uri, *given) if uri]


def hide(text: str) -> str:
    """``text`` with the credentials of the command line's URIs hidden, and those of any other URI in it."""
    for uri in _uris:
        text = redact(text, uri)
    return redact(text)


# -- errors -------------------------------------------------------------------------------------------------

class CliError(click.ClickException):
    """An expected failure: click prints ``Error: <message>`` on stderr and exits with 1."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(hide(message)))  # before a cut could split a URI


class BadUsage(CliError):
    """A value the user gave that bucketq's own checks refuse (``InvalidOption``, a malformed id): exit code 2,
    as for the values click checks, and the same one line as any other error."""

    exit_code = 2


def describe(exc: BaseException, uri: str = "") -> str | None:
    """A one-line explanation of an expected error, or None for a bug (which keeps its traceback)."""
    where = f" at {hide(uri)}" if uri else ""
    if isinstance(exc, ServerUnreachable):
        return str(exc)
    if isinstance(exc, ServerSelectionTimeoutError):
        return hide(unreachable(uri or None, exc))
    if isinstance(exc, ServerRefused):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ConfigurationError):
        return f"invalid MongoDB URI{' ' + hide(uri) if uri else ''}: {exc}"
    if isinstance(exc, InvalidName):
        return f"invalid name: {exc}"
    if isinstance(exc, OperationFailure):
        reason = (exc.details or {}).get("errmsg") or str(exc).split(", full error:")[0]
        return f"MongoDB refused the operation: {reason}"
    if isinstance(exc, PyMongoError):
        return f"MongoDB error{where}: {exc}"
    if isinstance(exc, BucketqError):
        return f"{type(exc).__name__}: {exc}"
    return None


@contextmanager
def redacted() -> Iterator[None]:
    """Around the whole command line: click's messages (usage errors included: a URI may be typed where a
    queue name goes) are redacted, and so is the traceback of a bug, which then exits with 1 as Python would."""
    try:
        yield
    except click.ClickException as exc:
        # click types message Final, but it is a plain attribute that format_message() reads; a new exception
        # in its place would lose the class and so the exit code (2 for usage errors)
        exc.message = hide(exc.message)  # type: ignore[misc]
        raise
    except (click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:
        click.echo(hide("".join(traceback.format_exception(exc))), err=True, nl=False)
        raise SystemExit(1) from None


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return hide(super().format(record))


LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])


def log_options(command: Callable[..., T]) -> Callable[..., T]:
    """Add --log-level (bucketq's loggers and the handler's) and --driver-log-level (pymongo's)."""
    command = click.option("--driver-log-level", type=LOG_LEVELS, default="warning", show_default=True,
                           help="Level of the driver's (pymongo's) loggers; at debug they log every command.")(command)
    return click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
                        help="Level of bucketq's own loggers and the handler's; not the driver's.")(command)


def log_to_stderr(level: str, driver_level: str = "warning") -> None:
    """Log lines (the library's, the handler's, asyncio's) go to stderr at ``level``, pymongo's at
    ``driver_level``, redacted."""
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("pymongo").setLevel(driver_level.upper())


# -- options, connection, queues -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    uri: str | None
    db: str | None
    connect_timeout: float


_OPTIONS = [
    click.option("--uri", envvar=URI_ENV, show_envvar=True, metavar="URI", help="MongoDB connection string."),
    click.option("--db", metavar="NAME", help="Database of the queue (default: the URI's, else 'bucketq')."),
    click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=3.0, show_default=True,
                 metavar="SECONDS", help="Give up when no server answers within this time."),
]


def connection_options(command: Callable[..., T]) -> Callable[..., T]:
    """Add --uri, --db and --connect-timeout; the command receives them as one ``target`` argument."""
    @functools.wraps(command)
    def wrapper(*args: Any, uri: str | None, db: str | None, connect_timeout: float, **kwargs: Any) -> T:
        return command(*args, target=Target(uri, db, connect_timeout), **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; expected errors become one line and exit code 1 (2 for ``InvalidOption``), Ctrl-C
    exits with 130."""
    try:
        return asyncio.run(coro)
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        raise SystemExit(130) from None
    except InvalidOption as exc:  # a value given on the command line, refused by the library
        raise BadUsage(f"InvalidOption: {exc}") from None
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise
        raise CliError(message) from None


@asynccontextmanager
async def database(target: Target) -> AsyncIterator[Any]:
    """The target database, after one ping proved the server answers (within ``connect_timeout``)."""
    if not target.uri:
        raise BadUsage(f"no MongoDB URI: pass --uri or set {URI_ENV}")
    try:
        client: AsyncMongoClient = client_of(target.uri, serverSelectionTimeoutMS=int(target.connect_timeout * 1000))
    except InvalidOption as exc:  # the URI's syntax or options: bad usage, like any other value refused
        raise BadUsage(str(exc)) from None
    try:
        try:
            await client.admin.command("ping")
            db = client[target.db or client.get_default_database(default=DEFAULT_DB).name]
        except (PyMongoError, ValueError) as exc:
            said = as_refused(exc, client) if isinstance(exc, ConfigurationError) else None
            raise CliError(describe(said or exc, target.uri) or str(exc)) from None
        yield db
    finally:
        await client.close()


async def require_queue(db: Any, name: str) -> None:
    """Fail unless ``name`` is a queue: read commands must not create one, nor read an unrelated collection."""
    collections = await collection_names(db)
    if name in collections and await is_queue(db, name, collections):
        return
    known = [n for n in sorted(collections) if await is_queue(db, n, collections)]
    hint = f"queues: {', '.join(known[:10])}{', …' if len(known) > 10 else ''}" if known else "it has no queues"
    if name in collections:
        hint = f"a collection of that name holds no buckets; {hint}"
    raise CliError(f"unknown queue {name!r} in database {db.name!r} ({hint})")


@asynccontextmanager
async def open_queue(target: Target, name: str, *, must_exist: bool = True, **options: Any) -> AsyncIterator[Queue]:
    """A ``Queue`` on the target database, drained and closed on the way out (pushes become visible)."""
    async with database(target) as db:
        if must_exist:
            await require_queue(db, name)
        queue = Queue(db, name=name, **options)
        try:
            yield queue
        finally:
            await queue.close()


def confirm(question: str, verb: str, done: str) -> None:
    """Ask on the terminal; without one (a script, a pipe) refuse rather than guess: --yes is the way."""
    if not sys.stdin or not sys.stdin.isatty():
        raise CliError(f"not confirmed (stdin is not a terminal); pass --yes to {verb} without asking")
    try:
        ok = click.confirm(question, default=False, err=True)
    except click.Abort:
        click.echo(err=True)
        raise CliError(f"not confirmed; pass --yes to {verb} without asking") from None
    if not ok:
        raise CliError(f"cancelled; nothing {done}")


# -- stop signals -------------------------------------------------------------------------------------------

@contextmanager
def stop_on_signals(callback: Callable[[], None]) -> Iterator[None]:
    """SIGINT/SIGTERM call ``callback``, a graceful stop request, for the long-running commands (watch, follow,
    worker)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, callback)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)

"""Expected failures become one line on stderr and exit code 1; nothing an operator can cause prints a traceback.
No message, traceback or log line shows a password: they all pass through ``redact_uri``."""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import click
from pymongo.errors import (
    ConfigurationError,
    InvalidName,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from bucketq.connection import redact_uri
from bucketq.errors import BucketqError

MAX_MESSAGE = 300


class CliError(click.ClickException):
    """An expected failure: click prints ``Error: <message>`` on stderr and exits with 1."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(redact_uri(message)))  # before a cut could split a URI


def one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return first if len(first) <= MAX_MESSAGE else first[:MAX_MESSAGE - 1] + "…"


def describe(exc: BaseException, uri: str = "") -> str | None:
    """A one-line explanation of an expected error, or None for a bug (which keeps its traceback)."""
    where = f" at {redact_uri(uri)}" if uri else ""
    if isinstance(exc, ServerSelectionTimeoutError):
        reason = re.sub(r" \(configured timeouts:[^)]*\)", "", str(exc).split(", Timeout:")[0])
        return f"cannot reach MongoDB{where}: {reason}"
    if isinstance(exc, ConfigurationError):
        return f"invalid MongoDB URI{' ' + redact_uri(uri) if uri else ''}: {exc}"
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
        exc.message = redact_uri(exc.message)
        raise
    except (click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:
        click.echo(redact_uri("".join(traceback.format_exception(exc))), err=True, nl=False)
        raise SystemExit(1) from None


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact_uri(super().format(record))


def log_to_stderr(level: str) -> None:
    """Log lines (the library's, pymongo's, asyncio's) go to stderr, redacted."""
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)

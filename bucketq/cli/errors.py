"""Expected failures become one line on stderr and exit code 1; nothing an operator can cause prints a traceback."""

from __future__ import annotations

import re

import click
from pymongo.errors import (
    ConfigurationError,
    InvalidName,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from bucketq.errors import BucketqError

MAX_MESSAGE = 300


class CliError(click.ClickException):
    """An expected failure: click prints ``Error: <message>`` on stderr and exits with 1."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return first if len(first) <= MAX_MESSAGE else first[:MAX_MESSAGE - 1] + "…"


def redact(uri: str) -> str:
    """The URI without its password, for messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", uri)


def describe(exc: BaseException, uri: str = "") -> str | None:
    """A one-line explanation of an expected error, or None for a bug (which keeps its traceback)."""
    where = f" at {redact(uri)}" if uri else ""
    if isinstance(exc, ServerSelectionTimeoutError):
        reason = re.sub(r" \(configured timeouts:[^)]*\)", "", str(exc).split(", Timeout:")[0])
        return f"cannot reach MongoDB{where}: {reason}"
    if isinstance(exc, ConfigurationError):
        return f"invalid MongoDB URI{' ' + redact(uri) if uri else ''}: {exc}"
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

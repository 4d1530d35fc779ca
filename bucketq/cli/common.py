"""What every command shares: the --uri/--db options, a fail-fast connection, opening a queue, running it all."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from bucketq.cli.errors import CliError, describe
from bucketq.connection import DEFAULT_DB, redact_uri
from bucketq.queue import Queue

T = TypeVar("T")
URI_ENV = "BUCKETQ_MONGODB_URI"
QUEUE_SUFFIXES = (".dead", ".quarantine", ".inbox")
BUCKET_FIELDS = ("v", "due", "lease")  # in every bucket and every tombstone (docs/FORMAT.md)


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
    """Run a command's coroutine; expected errors become one line and exit code 1, Ctrl-C exits with 130."""
    try:
        return asyncio.run(coro)
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        raise SystemExit(130) from None
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise
        raise CliError(message) from None


@asynccontextmanager
async def database(target: Target) -> AsyncIterator[Any]:
    """The target database, after one ping proved the server answers (within ``connect_timeout``)."""
    if not target.uri:
        raise CliError(f"no MongoDB URI: pass --uri or set {URI_ENV}")
    try:
        client: AsyncMongoClient = AsyncMongoClient(
            target.uri, serverSelectionTimeoutMS=int(target.connect_timeout * 1000), tz_aware=True)
    except (PyMongoError, ValueError, TypeError) as exc:  # the URI's syntax or options
        raise CliError(f"invalid MongoDB URI {redact_uri(target.uri)}: {exc}") from None
    try:
        try:
            await client.admin.command("ping")
            db = client[target.db or client.get_default_database(default=DEFAULT_DB).name]
        except (PyMongoError, ValueError) as exc:
            raise CliError(describe(exc, target.uri) or str(exc)) from None
        yield db
    finally:
        await client.close()


async def queue_names(db: Any) -> list[str]:
    """The queues of a database (see ``_is_queue``), in name order."""
    collections = await _collections(db)
    return [n for n in sorted(collections) if await _is_queue(db, n, collections)]


async def require_queue(db: Any, name: str) -> None:
    """Fail unless ``name`` is a queue: read commands must not create one, nor read an unrelated collection."""
    collections = await _collections(db)
    if name in collections and await _is_queue(db, name, collections):
        return
    known = [n for n in sorted(collections) if await _is_queue(db, n, collections)]
    hint = f"queues: {', '.join(known[:10])}{', …' if len(known) > 10 else ''}" if known else "it has no queues"
    if name in collections:
        hint = f"a collection of that name holds no buckets; {hint}"
    raise CliError(f"unknown queue {name!r} in database {db.name!r} ({hint})")


async def _collections(db: Any) -> set[str]:
    """The database's collections, without views and ``system.*``."""
    cursor = await db.list_collections()
    return {info["name"] async for info in cursor
            if info.get("type", "collection") == "collection" and not info["name"].startswith("system.")}


async def _is_queue(db: Any, name: str, collections: set[str]) -> bool:
    """Whether collection ``name`` holds a queue's buckets, told without writing and without opening a ``Queue``
    on it: a ``.dead``, ``.quarantine`` or ``.inbox`` collection beside it (a queue's first write makes them),
    or else a first document with the fields every bucket and tombstone has. Other collections are never
    read beyond that one document."""
    if name.endswith(QUEUE_SUFFIXES):
        return False
    if any(name + suffix in collections for suffix in QUEUE_SUFFIXES):
        return True
    first = await db[name].find_one({}, dict.fromkeys(BUCKET_FIELDS, 1))
    return first is not None and all(field in first for field in BUCKET_FIELDS)


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

"""Turn what the user passes (a URI, an ``AsyncMongoClient``, an ``AsyncDatabase``, a Motor client or
database, or an in-memory one from ``bucketq.memory``) into a database handle, and remember whether bucketq
owns (and must close) the client. Every client bucketq makes from a URI is made by ``client_of`` (the async
shells, the CLI, the batch and Spark shells), after ``check_uri``; URIs reach messages only through ``redact``.
The async shells made in one event loop from the same URI share one client (``connect``), closed with the last."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ConfigurationError, ServerSelectionTimeoutError
from pymongo.uri_parser import parse_uri

from bucketq.errors import BucketqError, InvalidOption
from bucketq.memory import MemoryClient, MemoryDatabase
from bucketq.motor_adapter import MotorDatabase, is_motor
from bucketq.shell.compatibility import as_refused
from bucketq.shell.redaction import redact

DEFAULT_DB = "bucketq"
C = TypeVar("C")
log = logging.getLogger("bucketq")


# Here, not in bucketq.errors, which imports no driver (tests/test_packaging.py).
class ServerUnreachable(BucketqError, ServerSelectionTimeoutError):
    """No MongoDB server answered: the message names the URI (redacted), what was tried for how long, and what
    each server said. Still a pymongo ``ServerSelectionTimeoutError``, as it was before bucketq wrapped it."""


_SCHEME = re.compile(r"mongodb(?:\+srv)?://")
_RESERVED = re.compile(r"[/?#\[\]@]|:.*:")  # in credentials: a character that must be percent-escaped there
_ESCAPE_HINT = ("percent-escape ':', '/', '?', '#', '[', ']' and '@' in the user name and password "
                "(urllib.parse.quote_plus), and '@' in a database name")


def check_uri(uri: str) -> dict[str, Any]:
    """pymongo's reading of ``uri`` (``parse_uri``), refused with ``InvalidOption`` when it is not a MongoDB URI,
    when pymongo would misread a password that holds a reserved character, or when pymongo refuses it (an
    unknown or invalid option included: pymongo would only warn of an unknown one and ignore it). pymongo's own
    warnings (a deprecated or repeated option) are logged instead, redacted. No message shows the credentials."""
    shown = redact(uri, uri)
    if not _SCHEME.match(uri):  # pymongo takes any other string for a host name
        raise InvalidOption(f"invalid MongoDB URI {shown}: it must begin with mongodb:// or mongodb+srv://")
    authority_and_path, _, options = uri[uri.index("://") + 3:].partition("?")
    if "@" in authority_and_path.partition("/")[2] or ("@" in options and "/" not in authority_and_path):
        # pymongo would read a part of the password as the database name, hosts or options
        raise InvalidOption(f"invalid MongoDB URI {shown}: an '@' follows the hosts; {_ESCAPE_HINT}")
    if _RESERVED.search(authority_and_path.partition("/")[0].rpartition("@")[0]):  # pymongo refuses it too
        raise InvalidOption(f"invalid MongoDB URI {shown}: the user name or password holds a reserved character; "
                            f"{_ESCAPE_HINT}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            parsed = parse_uri(uri)
        except Exception as exc:  # pymongo raises InvalidURI / ConfigurationError / ValueError
            raise InvalidOption(f"invalid MongoDB URI {shown}: {redact(str(exc), uri)}") from None
    for message in dict.fromkeys(str(warning.message) for warning in caught):  # pymongo may repeat one
        log.warning("MongoDB URI %s: %s", shown, redact(message, uri))
    return parsed


def client_of(uri: str, client_class: Callable[..., C] = AsyncMongoClient, **options: Any) -> C:  # type: ignore[assignment]
    """A ``client_class`` client of ``uri`` (not connected yet), after ``check_uri``; ``options`` are the
    client's keywords. A refused option raises ``InvalidOption`` without the credentials."""
    check_uri(uri)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # check_uri logged them
        try:
            return client_class(uri, tz_aware=True, connect=False, **options)
        except Exception as exc:  # pymongo's ConfigurationError / ValueError / TypeError for an option
            raise InvalidOption(f"invalid MongoDB client options for {redact(uri, uri)}: {redact(str(exc), uri)}") \
                from None


def server_errors(exc: ServerSelectionTimeoutError) -> str:
    """What each server answered, from pymongo's message (without its timeouts and topology description)."""
    return re.sub(r" \(configured timeouts:[^)]*\)", "", str(exc).split(", Timeout:")[0])


def unreachable(uri: str | None, exc: ServerSelectionTimeoutError, tried: str = "") -> str:
    """The line that says no server answered: ``uri`` (redacted; None when the caller passed a client), what was
    ``tried``, if said, and what each server said. pymongo's own message may name the servers only in its
    topology description, which this leaves out: the URI names them. A ``ServerUnreachable`` says it already."""
    if isinstance(exc, ServerUnreachable):
        return str(exc)
    where = f" at {redact(uri, uri)}" if uri else ""
    return redact(f"cannot reach MongoDB{where}: {f'{tried}: ' if tried else ''}{server_errors(exc)}", uri)


@contextmanager
def reaching(uri: str | None, what: str, limit: str = "", client: Any = None) -> Iterator[None]:
    """Raise bucketq's ``ServerUnreachable`` for a server that did not answer the code inside (sync or async): it
    names ``uri`` (redacted; None when the caller passed a client), ``what`` was tried for how long (and the
    ``limit`` that applied), and what each server said. A server that ``client``'s pymongo refuses (their wire
    versions do not overlap) raises ``ServerRefused``."""
    started = time.monotonic()
    try:
        yield
    except ServerSelectionTimeoutError as exc:
        tried = f"tried {what} for {time.monotonic() - started:.1f} s{f' ({limit})' if limit else ''}"
        raise ServerUnreachable(unreachable(uri, exc, tried)) from None
    except ConfigurationError as exc:
        refused = as_refused(exc, client)
        if refused is None:
            raise
        raise refused from None


@dataclass
class _SharedClient:
    client: AsyncMongoClient
    users: int = 0


# The clients made from a URI in each event loop (a client is bound to the loop it first ran in), by URI, with
# the number of connections that use each: queue objects of one process given the same URI share one.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SharedClient]] = \
    weakref.WeakKeyDictionary()


def _take_client(uri: str) -> AsyncMongoClient:
    """The running loop's client of ``uri``, made now unless there is one; one of its own outside a loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop yet to tell which client would work in it
        return client_of(uri)
    clients = _CLIENTS.setdefault(loop, {})
    shared = clients.get(uri)
    if shared is None:
        shared = clients[uri] = _SharedClient(client_of(uri))
    shared.users += 1
    return shared.client


def _released(client: AsyncMongoClient) -> bool:
    """One user fewer of ``client``: whether it had no other (and must be closed now)."""
    for clients in _CLIENTS.values():
        for uri, shared in clients.items():
            if shared.client is client:
                shared.users -= 1
                if shared.users:
                    return False
                del clients[uri]
                return True
    return True  # made outside a loop: its own


@dataclass
class Connection:
    database: Any  # AsyncDatabase, MotorDatabase or MemoryDatabase
    owned_client: AsyncMongoClient | None = None  # made by bucketq from a URI (maybe shared: ``connect``)
    uri: str | None = field(default=None, repr=False)  # as the user passed it: shown only through ``redact``

    async def close(self) -> None:
        """Close the client bucketq made, once no other connection of the loop uses it."""
        client, self.owned_client = self.owned_client, None
        if client is not None and _released(client):
            await client.close()


def connect(target: Any, db: str | None = None) -> Connection:
    """A connection to ``target`` (see the module's docstring); a URI's client is the one already made from the
    same URI in the running event loop, if any (one client per URI per process)."""
    if isinstance(target, str):
        client: AsyncMongoClient = _take_client(target)
        database = client[db] if db else client.get_default_database(DEFAULT_DB)
        return Connection(database, owned_client=client, uri=target)
    if isinstance(target, AsyncMongoClient):
        return Connection(target[db or _default_db(target)])
    if isinstance(target, (AsyncDatabase, MemoryDatabase)):
        return Connection(target if db is None else target.client[db])
    if isinstance(target, MemoryClient):
        return Connection(target[db or DEFAULT_DB])
    if is_motor(target):
        if type(target).__name__.endswith("Client"):  # AsyncIOMotorClient (hasattr lies: any name is a collection)
            return Connection(MotorDatabase(target[db or DEFAULT_DB]))
        return Connection(MotorDatabase(target if db is None else target.client[db]))
    raise InvalidOption(
        "Queue needs a MongoDB URI, an AsyncMongoClient, an AsyncDatabase, a Motor client/database or a "
        "bucketq.memory client/database, "
        f"got {type(target).__name__}"
    )


def _default_db(client: AsyncMongoClient) -> str:
    try:
        return client.get_default_database().name
    except Exception:  # no database in the URI
        return DEFAULT_DB

"""Turn what the user passes (a URI, an ``AsyncMongoClient``, an ``AsyncDatabase``, a Motor client or
database, or an in-memory one from ``bucketq.memory``) into a database handle, and remember whether bucketq
owns (and must close) the client."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.uri_parser import parse_uri

from bucketq.errors import InvalidOption
from bucketq.memory import MemoryClient, MemoryDatabase
from bucketq.motor_adapter import MotorDatabase, is_motor

DEFAULT_DB = "bucketq"


@dataclass
class Connection:
    database: Any  # AsyncDatabase, MotorDatabase or MemoryDatabase
    owned_client: AsyncMongoClient | None = None

    async def close(self) -> None:
        if self.owned_client is not None:
            await self.owned_client.close()


# userinfo in a mongodb:// or mongodb+srv:// URI: everything between the scheme and the last "@" before the hosts
_USERINFO = re.compile(r"(mongodb(?:\+srv)?://)([^@/?#\s]*(?:@[^@/?#\s]*)*)@", re.IGNORECASE)
_SECRET_OPTIONS = re.compile(r"((?:password|authMechanismProperties|tlsCertificateKeyFilePassword)=)[^&\s'\"]*",
                             re.IGNORECASE)


def redact_uri(text: str) -> str:
    """``text`` with the credentials of every MongoDB URI in it replaced by ``***``: for error messages, log
    lines and CLI output. The user name is kept (it helps to tell accounts apart), the password is not."""
    def userinfo(match: re.Match[str]) -> str:
        user = match.group(2).split(":", 1)[0]
        return f"{match.group(1)}{user}:***@" if ":" in match.group(2) else f"{match.group(1)}{user}@"

    return _SECRET_OPTIONS.sub(r"\1***", _USERINFO.sub(userinfo, text))


def connect(target: Any, db: str | None = None) -> Connection:
    if isinstance(target, str):
        try:
            parsed = parse_uri(target)
        except Exception as exc:  # pymongo raises InvalidURI / ConfigurationError / ValueError
            raise InvalidOption(f"invalid MongoDB URI {redact_uri(target)!r}: {redact_uri(str(exc))}") from None
        client: AsyncMongoClient = AsyncMongoClient(target, tz_aware=True, connect=False)
        return Connection(client[db or parsed.get("database") or DEFAULT_DB], owned_client=client)
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

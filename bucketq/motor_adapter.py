"""A thin adapter that lets a Motor database stand where bucketq expects PyMongo's ``AsyncDatabase``.

Motor was deprecated upstream in May 2026, but many services still hold Motor clients. Its collections already
have awaitable ``insert_many``/``update_one``/... ; only ``aggregate`` and ``watch`` differ (Motor returns
their cursors without an await), so those two are wrapped and everything else passes through.
"""

from __future__ import annotations

from typing import Any


def is_motor(obj: Any) -> bool:
    return type(obj).__module__.startswith("motor.")


class MotorCollection:
    def __init__(self, collection: Any) -> None:
        self._collection = collection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collection, name)

    @property
    def name(self) -> str:
        return self._collection.name

    def with_options(self, **kwargs: Any) -> MotorCollection:
        return MotorCollection(self._collection.with_options(**kwargs))

    async def aggregate(self, pipeline: list[dict], **kwargs: Any) -> Any:
        return self._collection.aggregate(pipeline, **kwargs)

    async def watch(self, pipeline: list[dict] | None = None, **kwargs: Any) -> Any:
        # Motor opens the stream lazily, at the first try_next(); errors surface there, as callers expect.
        return self._collection.watch(pipeline, **kwargs)


class MotorDatabase:
    """Wraps ``AsyncIOMotorDatabase``; ``db[name]`` gives a ``MotorCollection``."""

    def __init__(self, database: Any) -> None:
        self._database = database

    def __getattr__(self, name: str) -> Any:
        return getattr(self._database, name)

    def __getitem__(self, name: str) -> MotorCollection:
        return MotorCollection(self._database[name])

    @property
    def name(self) -> str:
        return self._database.name

    @property
    def client(self) -> Any:
        return self._database.client

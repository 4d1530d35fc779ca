"""Reads of a database's collections before any queue or stream is opened on them (``bucketq.list_queues``,
the CLI's discovery): nothing here writes."""

from __future__ import annotations

from typing import Any

from bucketq.core.scans import SCAN


async def collection_names(database: Any) -> set[str]:
    """The database's collections, without views and ``system.*``."""
    cursor = await database.list_collections()
    return {info["name"] async for info in cursor
            if info.get("type", "collection") == "collection" and not info["name"].startswith("system.")}


async def first_document(database: Any, name: str, fields: tuple[str, ...]) -> dict | None:
    """The first document of collection ``name``, with ``fields`` only (one document read, whatever it holds)."""
    return await database[name].find_one({}, dict.fromkeys(fields, 1), **SCAN)

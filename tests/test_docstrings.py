"""Every public name and method has a docstring: the API reference (docs/reference/) is generated from them.

Public means what ``bucketq.__all__`` lists and the documented entry points (``bucketq.batch``, ``bucketq.outbox``,
``bucketq.testing``, ``bucketq.memory``, ``bucketq.web.create_app``), with their methods and properties whose
names do not begin with ``_``. A method that overrides a documented one inherits its docstring (``inspect.getdoc``).
The in-memory database's classes stand in for pymongo's: a member that pymongo's counterpart has (``find``,
``insert_one``...) is documented by pymongo, so only their own members (``faults``, ``operations``) need one here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.cursor import AsyncCursor
from pymongo.asynchronous.database import AsyncDatabase

import bucketq
import bucketq.batch
import bucketq.memory
import bucketq.outbox
import bucketq.testing
import bucketq.web.app

pytestmark = pytest.mark.unit

ENTRY_POINTS: dict[str, Any] = {
    "bucketq": bucketq,
    "bucketq.batch.BatchQueue": bucketq.batch.BatchQueue,
    "bucketq.batch.Batch": bucketq.batch.Batch,
    "bucketq.outbox": bucketq.outbox,
    "bucketq.outbox.event": bucketq.outbox.event,
    "bucketq.testing": bucketq.testing,
    "bucketq.testing.queue": bucketq.testing.queue,
    "bucketq.testing.run": bucketq.testing.run,
    "bucketq.testing.Report": bucketq.testing.Report,
    "bucketq.testing.Delivery": bucketq.testing.Delivery,
    "bucketq.memory": bucketq.memory,
    "bucketq.web.create_app": bucketq.web.app.create_app,
}
# pymongo's class that each in-memory class stands in for: the members they share are pymongo's to document.
STANDS_IN_FOR: dict[type, type] = {
    bucketq.memory.MemoryClient: AsyncMongoClient,
    bucketq.memory.MemoryDatabase: AsyncDatabase,
    bucketq.memory.MemoryCollection: AsyncCollection,
    bucketq.memory.AsyncCursor: AsyncCursor,
    bucketq.memory.ChangeStream: AsyncChangeStream,
    bucketq.memory.SyncDatabase: pymongo.database.Database,
    bucketq.memory.SyncCollection: pymongo.collection.Collection,
    bucketq.memory.Cursor: pymongo.cursor.Cursor,
}


def public_objects() -> dict[str, Any]:
    """Every public name that can carry a docstring (constants such as ``FORMAT_VERSION`` cannot)."""
    found = {**{f"bucketq.{name}": getattr(bucketq, name) for name in bucketq.__all__}, **ENTRY_POINTS}
    found |= {f"bucketq.memory.{name}": getattr(bucketq.memory, name) for name in bucketq.memory.__all__}
    return {name: obj for name, obj in found.items()
            if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)}


def own_docstring(obj: Any) -> str:
    """The object's own docstring: a class's is not inherited, and a dataclass's generated signature is none."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else inspect.getdoc(obj)
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and (doc or "").startswith(f"{obj.__name__}("):
        return ""
    return (doc or "").strip()


def public_members(cls: type) -> Iterator[tuple[str, Any]]:
    """The methods and properties ``cls`` defines itself, public and not stood in for by pymongo's."""
    mirror = STANDS_IN_FOR.get(cls)
    for name, value in vars(cls).items():
        if name.startswith("_") or (mirror is not None and hasattr(mirror, name)):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if isinstance(value, property | dataclasses.Field) or inspect.isfunction(value):
            yield name, getattr(cls, name) if inspect.isfunction(value) else value


def undocumented() -> list[str]:
    missing = []
    for name, obj in public_objects().items():
        if not own_docstring(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in public_members(obj):
                if not (inspect.getdoc(value) or "").strip():
                    missing.append(f"{name}.{member}")
    return missing


def test_every_public_name_and_method_has_a_docstring() -> None:
    assert undocumented() == []


def test_the_check_sees_a_missing_docstring() -> None:
    class Undocumented:
        def method(self) -> None:
            pass

    assert not own_docstring(Undocumented)
    assert [name for name, _ in public_members(Undocumented)] == ["method"]
    assert not inspect.getdoc(Undocumented.method)


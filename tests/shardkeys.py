"""The shard-key audit: a pymongo ``CommandListener`` that sees every command a client sends and names each one,
against a collection to be sharded, that a mongos could not route to the shards of one shard-key value.

A command is *targeted* when its filter pins the shard key's first field by equality (a value, ``{$eq: v}``, an
``$and`` with such a clause, or an ``$or`` whose every branch has one), and an insert when every document has
the field. Commands marked ``comment: "bucketq:scan"`` (operators' whole-collection reads, ``bucketq.core.scans``)
are the documented scatter-gathers: they are counted apart, by command, not reported. Cursor follow-ups
(``getMore``, ``killCursors``) go where their cursor went; catalogue and index commands are not routed by key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pymongo import monitoring

from bucketq.core.scans import SCAN_COMMENT

NOT_ROUTED_BY_KEY = {"getMore", "killCursors", "createIndexes", "listIndexes", "listCollections", "drop",
                     "dropIndexes", "create", "endSessions", "hello", "isMaster", "ismaster", "ping", "buildInfo",
                     "buildinfo", "serverStatus", "dropDatabase", "listDatabases", "saslStart", "saslContinue"}


def pins(query: Any, key: str) -> bool:
    """Whether ``query`` restricts ``key`` to one value, so a mongos can target the shards of that value."""
    if not isinstance(query, Mapping):
        return False
    if key in query:
        value = query[key]
        return not isinstance(value, Mapping) or "$eq" in value
    return (any(pins(clause, key) for clause in query.get("$and", ()))
            or bool(query.get("$or")) and all(pins(branch, key) for branch in query["$or"]))


def _routed(command_name: str, command: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The (kind, filter or document) pairs a mongos routes ``command`` by."""
    if command_name == "insert":
        for doc in command.get("documents", ()):
            yield "document", doc
    elif command_name == "update":
        for op in command.get("updates", ()):
            yield "filter", op.get("q", {})
    elif command_name == "delete":
        for op in command.get("deletes", ()):
            yield "filter", op.get("q", {})
    elif command_name in ("find", "count", "distinct"):
        yield "filter", command.get("filter", command.get("query", {}))
    elif command_name == "findAndModify":
        yield "filter", command.get("query", {})
    elif command_name == "aggregate":
        pipeline = command.get("pipeline") or [{}]
        first = pipeline[0]
        if "$changeStream" in first:
            return  # a change stream is opened on every shard by design (docs/SCALING.md)
        yield "filter", first.get("$match", {})
    else:
        yield "filter", {}


@dataclass
class ShardKeyAudit(monitoring.CommandListener):
    """Pass it to a client (``AsyncMongoClient(uri, event_listeners=[audit])``). ``keys`` maps each collection
    name to be sharded (without the database) to the first field of its shard key."""

    database: str
    keys: Mapping[str, str]
    untargeted: list[str] = field(default_factory=list)
    scans: Counter[str] = field(default_factory=Counter)
    targeted: Counter[str] = field(default_factory=Counter)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.database_name != self.database or event.command_name in NOT_ROUTED_BY_KEY:
            return
        collection = event.command.get(event.command_name)
        if not isinstance(collection, str) or collection not in self.keys:
            return
        label = f"{event.command_name} on {collection}"
        if event.command.get("comment") == SCAN_COMMENT:
            self.scans[label] += 1
            return
        key = self.keys[collection]
        for kind, routed in _routed(event.command_name, event.command):
            ok = key in routed if kind == "document" else pins(routed, key)
            if ok:
                self.targeted[label] += 1
            else:
                self.untargeted.append(f"{label}: {kind} {dict(routed)!r} lacks {key!r}")

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

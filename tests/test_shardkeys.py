"""The shard-key audit (tests/shardkeys.py) itself: what it counts as targeted, and that it names a command that
is not. The audit over the library's own commands is in the partition tests."""

from __future__ import annotations

from typing import Any

from pymongo import monitoring

from tests.shardkeys import ShardKeyAudit, pins


def test_pins_needs_one_value_of_the_field() -> None:
    assert pins({"pt": 3, "due": {"$lte": 1}}, "pt")
    assert pins({"pt": {"$eq": 3}}, "pt")
    assert pins({"$and": [{"due": {"$lte": 1}}, {"pt": 0}]}, "pt")
    assert pins({"$or": [{"pt": 0, "a": 1}, {"pt": 0, "b": 1}]}, "pt")
    assert not pins({"$or": [{"pt": 0}, {"b": 1}]}, "pt")
    assert not pins({"pt": {"$in": [0, 1]}}, "pt")
    assert not pins({"due": {"$lte": 1}}, "pt")
    assert not pins({}, "pt")


def _event(command: dict[str, Any], database: str = "db") -> monitoring.CommandStartedEvent:
    return monitoring.CommandStartedEvent(command, database, 1, ("127.0.0.1", 1), 1)


def test_the_audit_names_each_untargeted_command_and_counts_scans_apart() -> None:
    audit = ShardKeyAudit("db", {"q": "pt"})
    audit.started(_event({"findAndModify": "q", "query": {"pt": 1, "due": {"$lte": 0}}, "update": {}}))
    audit.started(_event({"update": "q", "updates": [{"q": {"_id": 1, "pt": 0}}, {"q": {"_id": 2}}]}))
    audit.started(_event({"insert": "q", "documents": [{"_id": 1, "pt": 0}, {"_id": 2}]}))
    audit.started(_event({"aggregate": "q", "pipeline": [{"$match": {}}], "comment": "bucketq:scan"}))
    audit.started(_event({"aggregate": "q", "pipeline": [{"$changeStream": {}}]}))
    audit.started(_event({"find": "q.dead", "filter": {}}))  # not to be sharded
    audit.started(_event({"find": "q", "filter": {}}, database="other"))
    audit.started(_event({"getMore": 1, "collection": "q"}))
    assert audit.untargeted == ["update on q: filter {'_id': 2} lacks 'pt'",
                                "insert on q: document {'_id': 2} lacks 'pt'"]
    assert audit.scans == {"aggregate on q": 1}
    assert audit.targeted == {"findAndModify on q": 1, "update on q": 1, "insert on q": 1}

"""Detect, over a real connection, which optional server features the test server has.

Used to skip (with the reason printed) tests that need what mongo-java-server lacks; never to fake them.
"""

from __future__ import annotations

import uuid

from pymongo import MongoClient
from pymongo.errors import ConfigurationError, OperationFailure


def server_features(uri: str) -> frozenset[str]:
    found: set[str] = set()
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        hello = client.admin.command("isMaster")
        if hello.get("setName") and hello.get("logicalSessionTimeoutMinutes") is not None:
            found.add("transactions")
        probe = client[f"bq_probe_{uuid.uuid4().hex[:8]}"]
        try:
            probe.t.create_index("at", expireAfterSeconds=60)
            if any("expireAfterSeconds" in ix for ix in probe.t.list_indexes()):
                found.add("ttl")
            probe.p.create_index("k", unique=True, partialFilterExpression={"k": {"$exists": True}})
            probe.p.insert_many([{"x": 1}, {"x": 2}])  # two docs without k: rejected unless really partial
            found.add("partial_indexes")
        except (OperationFailure, ConfigurationError):
            pass
        finally:
            client.drop_database(probe.name)
    finally:
        client.close()
    return frozenset(found)

"""Detect, over a real connection, which optional server features the test server has.

Used to skip (with the reason printed) tests that need what mongo-java-server lacks; never to fake them.
mongo-java-server accepts TTL and partial index options and then ignores them, so their presence in
``listIndexes`` proves nothing: TTL is credited to real mongod servers only (``buildInfo.gitVersion``),
and partial indexes and change streams (which a standalone mongod refuses) are probed by behaviour.
"""

from __future__ import annotations

import time
import uuid

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import DuplicateKeyError, OperationFailure


def server_features(uri: str) -> frozenset[str]:
    found: set[str] = set()
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        hello = client.admin.command("isMaster")
        if hello.get("setName"):
            found.add("replica_set")
            if hello.get("logicalSessionTimeoutMinutes") is not None:
                found.add("transactions")
        if "gitVersion" in client.admin.command("buildInfo"):
            found.add("ttl")
        probe = client[f"bq_probe_{uuid.uuid4().hex[:8]}"]
        try:
            probe.p.create_index("k", unique=True, partialFilterExpression={"k": {"$exists": True}})
            probe.p.insert_many([{"x": 1}, {"x": 2}])  # two docs without k: rejected unless really partial
            found.add("partial_indexes")
        except (DuplicateKeyError, OperationFailure):
            pass
        try:
            # a start time, as bucketq gives: the test server leaves operationTime out of its replies
            with probe.p.watch(max_await_time_ms=1, start_at_operation_time=Timestamp(int(time.time()), 0)) as stream:
                stream.try_next()
            found.add("change_streams")
        except OperationFailure:
            pass
        finally:
            client.drop_database(probe.name)
    finally:
        client.close()
    return frozenset(found)

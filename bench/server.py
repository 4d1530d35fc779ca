"""Which server the bench runs against, and an honest label for it.

BUCKETQ_MONGODB_URI if set; otherwise an embedded mongo-java-server started here and stopped by PID.
The embedded one keeps its whole oplog in memory (every write of the run), so it is restarted on the same
port before it has taken RESTART_AFTER_BYTES of payloads, and whenever it stops answering.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

DB = "bucketq_bench"  # the only database the bench writes to, dropped around every job
POM = Path(__file__).resolve().parent.parent / "devtools" / "testserver" / "pom.xml"
RESTART_AFTER_BYTES = 1536 << 20


@dataclass
class Server:
    uri: str
    label: str
    real_mongod: bool
    replica_set: bool
    embedded: Any = None  # the TestServer started here, if any
    written_bytes: int = 0

    def cpu_s(self) -> float | None:
        """The embedded server's CPU seconds so far (all its threads: JIT and GC too); None for any other."""
        return process_cpu_s(self.embedded.pid if self.embedded is not None else None)

    def drop_bench_db(self) -> None:
        with contextlib.closing(MongoClient(self.uri, serverSelectionTimeoutMS=10_000)) as client:
            client.drop_database(DB)

    def alive(self) -> bool:
        try:
            with contextlib.closing(MongoClient(self.uri, serverSelectionTimeoutMS=3_000)) as client:
                client.admin.command("ping")
            return True
        except PyMongoError:
            return False

    def make_room(self, job_bytes: int) -> bool:
        """Before a job writing job_bytes: restart the embedded server if its oplog would outgrow
        RESTART_AFTER_BYTES or it stopped answering. True if it was restarted (its JIT is cold again)."""
        if self.embedded is None:
            return False
        if self.written_bytes + job_bytes <= RESTART_AFTER_BYTES and self.alive():
            self.written_bytes += job_bytes
            return False
        self.embedded.restart()
        self.written_bytes = job_bytes
        return True


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), None if unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mongo_java_server_version() -> str:
    found = re.search(r"<mongo-java-server\.version>([^<]+)<", POM.read_text()) if POM.exists() else None
    return found.group(1) if found else "?"


def describe(uri: str, embedded: Any = None) -> Server:
    with contextlib.closing(MongoClient(uri, serverSelectionTimeoutMS=10_000)) as client:
        build = client.admin.command("buildInfo")
        hello = client.admin.command("isMaster")
        host, port = client.address or ("?", 0)
    real = "gitVersion" in build  # mongo-java-server answers buildInfo with a version only
    set_name = hello.get("setName")
    where = f"{host}:{port}"
    if embedded:
        label = f"mongo-java-server {_mongo_java_server_version()} (in-memory, embedded test server) on {where}"
    elif real:
        topology = f"replica set {set_name}" if set_name else "standalone"
        label = f"MongoDB {build.get('version')} ({topology}) at {where}"
    else:
        version = build.get("version")
        label = f"MongoDB-wire server reporting {version} without gitVersion (not a real mongod) at {where}"
    return Server(uri=uri, label=label, real_mongod=real, replica_set=bool(set_name), embedded=embedded)


@contextlib.contextmanager
def server() -> Iterator[Server]:
    uri = os.environ.get("BUCKETQ_MONGODB_URI")
    if uri:
        yield describe(uri)
        return
    from devtools.testserver import TestServer

    with TestServer() as test_server:
        yield describe(test_server.uri, embedded=test_server)

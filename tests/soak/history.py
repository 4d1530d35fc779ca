"""The soak run's history: ``<run>/history/<proc>.jsonl`` per process and ``<run>/resources.jsonl`` (the format
``tests/soak/checker.py`` reads), one JSON object a line, each written with one ``write(2)`` so that it survives a
SIGKILL of its writer and the lines of several threads (sync handlers) or processes never interleave.

``at`` is the server's clock as this process estimates it, read as bucketq reads it (``bucketq.clock``: an
``isMaster`` round trip anchors the host's monotonic clock), so that a clock step on the host (``SIGUSR1``,
``tests/stress/consumer.py``) moves nothing here; ``err`` is that estimate's error bound.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from bucketq.shell.clock import ServerClock

RESOURCE_EVERY_S = 3.0


class JsonLines:
    """An append-only JSON-lines file; each record is one ``write(2)`` under a lock (handler threads write too)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line."""
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        """Close the file (after the last write)."""
        with self._lock:
            os.close(self._fd)


class History:
    """What one process writes: its ops into ``<run>/history/<proc>.jsonl``, its samples into
    ``<run>/resources.jsonl`` (shared, appended by every process)."""

    def __init__(self, run_dir: Path, proc: str) -> None:
        self.proc = proc
        self.clock = ServerClock()
        self._ops = JsonLines(run_dir / "history" / f"{proc}.jsonl")
        self._resources = JsonLines(run_dir / "resources.jsonl")

    def stamp(self) -> dict[str, Any]:
        """``at`` and ``err`` (ms) now, by this process's estimate of the server's clock."""
        return {"at": self.clock.now().timestamp() * 1000, "err": self.clock.error().total_seconds() * 1000}

    def op(self, op: str, **fields: Any) -> None:
        """Append an op record, stamped with this process's reading of the server's clock."""
        self._ops.write({**self.stamp(), "proc": self.proc, "op": op, **fields})

    def sample(self, metric: str, value: float, *, proc: str | None = None, server: str | None = None) -> None:
        """A resource sample of this process, of ``proc`` (the runner samples its children), or of the server
        (``server``: ``"server"`` for what lasts across its restarts, ``"server.g<n>"`` for one process of it)."""
        who = {"server": server} if server else {"proc": proc or self.proc}
        self._resources.write({"at": self.stamp()["at"], **who, "metric": metric, "value": value})

    async def sync(self, database: Any) -> None:
        """Anchor the clock (async client); once at start, then whenever ``ServerClock.stale`` says so."""
        if self.clock.stale:
            await self.clock.sync(database)

    def sync_blocking(self, database: Any) -> None:
        """The same for a synchronous client (the runner's)."""
        if self.clock.stale:
            self.clock.sync_blocking(database)

    def close(self) -> None:
        """Close both files."""
        self._ops.close()
        self._resources.close()

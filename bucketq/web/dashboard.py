"""What the dashboard shows and does, apart from HTTP: the queues and streams of one database, read through
``Queue`` and ``Stream`` (so through the store layer), the sampler behind the charts, and the write actions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bucketq.core.format import SEQ_SUFFIX
from bucketq.core.holdings import by_holder
from bucketq.queue import Queue, internals
from bucketq.shell.clock import ServerClock
from bucketq.shell.connection import connect, reaching
from bucketq.shell.discovery import queue_names
from bucketq.shell.flow import Flow
from bucketq.shell.redaction import redact
from bucketq.shell.text_views import DEAD, QUARANTINE, Kind, one_line
from bucketq.store.aio.catalog import collection_names
from bucketq.stream import Stream
from bucketq.web.history import History

log = logging.getLogger("bucketq.web")
ENTRY_ROWS = 50  # dead letters and quarantine entries on a page of their listing
NEXT_ROWS = 10  # the next messages a queue's page shows (``Queue.peek``)


@dataclass(frozen=True)
class Action:
    """A write action on a queue: the question the confirmation page asks, and what it does. An action on dead
    letters or quarantine (``entries``) takes the CLI's filter by error text: ``matching`` and ``which`` (" whose
    error contains ..." or nothing) in its texts say what it covers."""

    label: str
    question: str  # formatted with the queue's stats, ``name``, ``matching`` and ``which``
    run: Callable[[Queue, str | None], Awaitable[Any]]  # the queue and the error filter (None: every entry)
    done: str  # formatted with ``n`` (what ``run`` returned), ``name`` and ``which``
    entries: Kind | None = None


ACTIONS = {
    "pause": Action("Pause", "Pause queue {name!r}? Consumers stop claiming within a second; pushes still work.",
                    lambda q, _: q.pause(), "paused queue {name!r}"),
    "resume": Action("Resume", "Resume queue {name!r}?", lambda q, _: q.resume(), "resumed queue {name!r}"),
    "purge": Action("Purge messages", "Delete every message of queue {name!r}: {ready:,} ready, {scheduled:,} "
                    "scheduled, {in_flight:,} in flight? Dead letters and quarantine are kept.",
                    lambda q, _: q.purge(), "purged {n:,} message(s) of queue {name!r}"),
    "requeue-dead": Action("Requeue dead letters", "Put the {matching:,} dead letter(s){which} of queue {name!r} "
                           "back, ready now with their tries reset?",
                           lambda q, error: q.requeue_dead(error_contains=error),
                           "requeued {n:,} dead letter(s){which} of queue {name!r}", DEAD),
    "purge-dead": Action("Purge dead letters", "Delete the {matching:,} dead letter(s){which} of queue {name!r} "
                         "for good?", lambda q, error: q.purge_dead(error_contains=error),
                         "purged {n:,} dead letter(s){which} of queue {name!r}", DEAD),
    "requeue-quarantined": Action("Requeue quarantine", "Put the {matching:,} quarantined entries{which} of queue "
                                  "{name!r} back in the queue?",
                                  lambda q, error: q.requeue_quarantined(error_contains=error),
                                  "requeued {n:,} quarantined entries{which} of queue {name!r}", QUARANTINE),
    "purge-quarantined": Action("Purge quarantine", "Delete the {matching:,} quarantined entries{which} of queue "
                                "{name!r} for good?", lambda q, error: q.purge_quarantined(error_contains=error),
                                "purged {n:,} quarantined entries{which} of queue {name!r}", QUARANTINE),
}
QUEUE_ACTIONS = tuple(verb for verb, action in ACTIONS.items() if action.entries is None)


def which(kind: Kind, error: str | None) -> str:
    """How a question or a report names the entries an error filter selects ("" for all of them)."""
    return f" whose {kind.reason} contains {error!r}" if error else ""


RESETS = ("beginning", "end")  # where the dashboard can move a reader group


class Dashboard:
    """One database's queues and streams. ``target`` and ``db`` are what ``Queue`` takes. The sampler
    (``start``/``close``) reads every queue's and stream's stats each ``interval_s`` into ``history``."""

    def __init__(self, target: Any, *, db: str | None = None, interval_s: float = 10.0) -> None:
        self._connection = connect(target, db)
        self.uri = self._connection.uri
        self.database = self._connection.database
        self.history = History(interval_s)
        self.clock = ServerClock()  # what the pages count ages from: the server's time, not this host's
        self._queues: dict[str, Queue] = {}
        self._streams: dict[str, Stream] = {}
        self._flows: dict[str, Flow] = {}
        self._sampler: asyncio.Task[None] | None = None
        self.measures_rates = True  # False once a queue's change stream could not be opened

    # -- reading -------------------------------------------------------------------------------------------

    async def sync_clock(self) -> None:
        """Measure the server's clock when the last reading is due for renewal (``ServerClock.stale``)."""
        if self.clock.stale:
            await self.clock.sync(self.database)

    async def queue_names(self) -> list[str]:
        return await queue_names(self.database)

    async def stream_names(self) -> list[str]:
        return sorted(c[:-len(SEQ_SUFFIX)] for c in await collection_names(self.database) if c.endswith(SEQ_SUFFIX))

    async def queue(self, name: str) -> Queue | None:
        """The queue ``name``, or None when the database has no such queue (nothing is created)."""
        if name not in self._queues and name in await self.queue_names():
            self._queues[name] = Queue(self.database, name=name)
        return self._queues.get(name)

    async def stream(self, name: str) -> Stream | None:
        """The stream ``name``, or None when the database has no such stream (nothing is created)."""
        if name not in self._streams and name in await self.stream_names():
            self._streams[name] = Stream(self.database, name=name)
        return self._streams.get(name)

    async def queue_rows(self) -> dict[str, dict[str, Any]]:
        """Every queue's ``Queue.stats()``, with ``paused``."""
        rows = {}
        for name in await self.queue_names():
            queue = await self.queue(name)
            if queue is not None:
                rows[name] = {**await queue.stats(), "paused": await queue.paused()}
        return rows

    async def stream_rows(self) -> dict[str, dict[str, Any]]:
        """Every stream's ``Stream.stats()``."""
        rows = {}
        for name in await self.stream_names():
            stream = await self.stream(name)
            if stream is not None:
                rows[name] = await stream.stats()
        return rows

    async def held(self, queue: Queue) -> dict[str, dict[str, Any]]:
        """Who holds what in ``queue`` now: ``core.holdings.by_holder`` of its live leases and group locks."""
        door = internals(queue)
        buckets, locks = await door.store.held(door.clock.latest())
        return by_holder(buckets, locks)

    # -- sampling ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._sample_forever(), name="bucketq-web-sampler")

    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                # a server away names itself as the URI gives it (redacted), not only in pymongo's topology tuples
                with reaching(self.uri, "a dashboard sample", client=self.database.client):
                    await self.sample()
            except Exception as exc:  # a server away for a while: the charts get a gap, the next sample retries
                log.warning("dashboard sample failed: %s", one_line(redact(f"{type(exc).__name__}: {exc}", self.uri)))
            await asyncio.sleep(max(0.0, self.history.interval_s - (time.monotonic() - started)))

    async def sample(self) -> None:
        """Add one point to every chart: per queue the messages pending, ready and dead, and the messages in and
        out per second (with change streams); per stream each group's lag."""
        now = time.time()
        for name, row in (await self.queue_rows()).items():
            if name not in self._flows:
                self._flows[name] = await Flow.open(self.database, name, log.info)
                self.measures_rates = self.measures_rates and self._flows[name].watching
            rates = await self._flows[name].rates(row)
            for field in ("pending", "ready", "dead"):
                self.history.add(("queue", name, field), now, row[field])
            for field in ("in_per_s", "out_per_s"):
                self.history.add(("queue", name, field), now, rates[field] if rates else None)
        for name, row in (await self.stream_rows()).items():
            for group, lag in row["groups"].items():
                self.history.add(("stream", name, group), now, lag["lag_messages"])

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        for flow in self._flows.values():
            await flow.close()
        for queue in self._queues.values():
            await queue.close()
        for stream in self._streams.values():
            await stream.close()
        await self._connection.close()

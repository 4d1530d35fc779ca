"""Waking idle consumers: a consumer claims when a wake-up says that a bucket may be claimable, not at every
``reserve``. Wake-ups: a local signal (pushes from the same queue object, hand-offs this consumer made);
change-stream events, where the server has them (an insert, a release, a group's hand-off), which carry the
bucket's due time; timers at due times the consumer knows of (such events, its own retry copies, and the next
due bucket, read after a claim that found nothing); and polls: without a stream every poll interval or
sooner (backing off from ``POLL_FIRST_S``), with one a slow jittered safety poll (``SAFETY_POLL_S``) for
what no event announces. A wake-up may watch several collections (a queue's buckets and its pause document),
one change stream each. An event that names its bucket's partition (``pt``) makes the next check look there
first (``checking``). The same ``Wakeup`` paces the outbox relay's passes and a stream reader's claims."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from bucketq.shell.clock import ServerClock
from bucketq.store.aio.base import raise_if_cancelled
from bucketq.store.aio.changes import STREAM_AWAIT_MS

log = logging.getLogger("bucketq")

POLL_FIRST_S = 0.01
# With a change stream working, a check for work that found none is repeated after a random time in this range
# unless a wake-up comes first: it catches what no event or timer announces (a bucket whose event was missed,
# one written by hand). Jittered, so that the consumers of a fleet started together do not poll together.
SAFETY_POLL_S = (40.0, 60.0)
# Some servers (the test server among them) answer an empty change-stream getMore at once instead of waiting
# maxAwaitTimeMS; an empty answer that came back in less than half that wait is followed by a pause, from
# STREAM_PAUSE_FIRST_S, doubling while the stream stays empty up to the wait of a server that holds it
# (STREAM_AWAIT_MS), and back to the first after an event: about one getMore a second while idle, as against
# a server that holds it. ("At once" can take tens of milliseconds: the test server scans its oplog each time.)
STREAM_QUICK_EMPTY_S = STREAM_AWAIT_MS / 2000
STREAM_PAUSE_FIRST_S = 0.04
STREAM_PAUSE_MAX_S = STREAM_AWAIT_MS / 1000

Watch = Callable[[Timestamp], Awaitable[Any]]  # a store's method that opens a change stream from a cluster time
# A watch, or a watch and what to call at each of its events before the wake-up (a pause gate's ``changed``)
Watched = Watch | tuple[Watch, Callable[[], None]]


class Wakeup:
    """When the next check for work (a claim, a relay pass) is called for: ``ready``, and ``wait`` until it is."""

    def __init__(self, poll_interval: float) -> None:
        self._changed = asyncio.Event()  # set when _woken or _check_at changes: a waiter looks again
        self._woken = False  # a wake-up came since the last check began
        self._check_at = float("-inf")  # monotonic time of the next poll or known due time
        self._poll_cap = poll_interval
        self._next_poll = POLL_FIRST_S
        self._hinted: list[int] = []  # partitions that events named since the last check began, first first
        self.streaming = False  # every change stream watched answered and none was lost since
        self._answered: set[int] = set()  # the watches (by index) whose stream answered
        self._ever_streamed = False
        self._tasks: list[asyncio.Task[None]] = []
        # No watch started yet, or one ended since (set by the tasks' done callbacks): ``start_stream`` has work.
        # Until then it returns at once, without walking the watches.
        self.stream_start_due = True

    @property
    def ready(self) -> bool:
        """Whether a check may find work: a wake-up came since the last one began, or a poll or due time passed."""
        return self._woken or time.monotonic() >= self._check_at

    def notify(self) -> None:
        self._woken = True
        self._next_poll = POLL_FIRST_S
        self._changed.set()

    def checking(self) -> list[int]:
        """A check for work begins: wake-ups from now on call for another; without one, the next is the poll.
        Returns the partitions that events named since the last check, to look at first."""
        self._woken = False
        hinted, self._hinted = self._hinted, []
        if self.streaming:
            self._check_at = time.monotonic() + random.uniform(*SAFETY_POLL_S)
        else:
            self._check_at = time.monotonic() + self._next_poll
            self._next_poll = min(self._poll_cap, self._next_poll * 2)
        return hinted

    def hit(self) -> None:
        """The check found work: check again at once (other waiters too), and poll eagerly after that."""
        self._next_poll = POLL_FIRST_S
        self._check_at = float("-inf")
        self._changed.set()

    def failed(self) -> None:
        """The check failed (a transient error): try again after the poll delay, stream or not."""
        self.due_at(time.monotonic() + self._next_poll)
        self._next_poll = min(self._poll_cap, self._next_poll * 2)

    def due_at(self, at: float) -> None:
        """Check again by monotonic time ``at``: a bucket is known to become claimable then."""
        if at < self._check_at:
            self._check_at = at
            self._changed.set()

    def due(self, due: dt.datetime, clock: ServerClock) -> None:
        """Check again when the server's clock reaches ``due`` for sure (a claim judges leases by the earliest
        reading the clock's error allows): at once if it has."""
        ahead = (due - clock.earliest()).total_seconds()
        if ahead > 0:
            self.due_at(time.monotonic() + ahead)
        else:
            self.notify()

    async def wait(self, limit: float) -> None:
        """Sleep until a check is called for (``ready``) or ``limit`` seconds have passed."""
        end = time.monotonic() + limit
        while not self.ready:
            delay = min(end, self._check_at) - time.monotonic()
            if delay <= 0:
                return
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), delay)

    def start_stream(self, watches: Watched | list[Watched], clock: ServerClock, required: bool) -> None:
        """Start watching (``watches``: one change stream each), or start again a stream that was lost after
        streams worked (a server restart). Called with the same watches each time; a no-op unless
        ``stream_start_due``."""
        if not self.stream_start_due:
            return
        listed = watches if isinstance(watches, list) else [watches]
        if not self._tasks:
            self._tasks = [self._start_watch(i, w, clock, required) for i, w in enumerate(listed)]
        elif self._ever_streamed:
            for i, task in enumerate(self._tasks):
                if task.done():
                    self._tasks[i] = self._start_watch(i, listed[i], clock, required)
        else:  # a watch ended before streams ever worked: polling it is (asked again at the next call)
            return
        self.stream_start_due = False

    def _start_watch(self, index: int, watched: Watched, clock: ServerClock, required: bool) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._watch(index, watched, clock, required),
                                                      name="bucketq-watch")
        task.add_done_callback(self._watch_ended)
        return task

    def _watch_ended(self, _task: asyncio.Task[None]) -> None:
        self.stream_start_due = True

    @property
    def watching(self) -> bool:
        """Whether a change stream is open or being opened."""
        return any(not task.done() for task in self._tasks)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.stream_start_due = True
        self._answered.clear()
        self.streaming = False

    async def _watch(self, index: int, watched: Watched, clock: ServerClock, required: bool) -> None:
        watch, heard = watched if isinstance(watched, tuple) else (watched, None)
        # startAtOperationTime spares a server round trip and is needed by servers (such as the test server)
        # that leave operationTime out of their replies; a second back covers a small clock error.
        start = Timestamp(int(clock.now().timestamp()) - 1, 0)
        try:
            stream = await watch(start)
            try:
                pause = STREAM_PAUSE_FIRST_S
                while True:
                    asked = time.monotonic()
                    event = await stream.try_next()
                    raise_if_cancelled()  # a cancel the driver swallowed: stop() waits for this task
                    self._answered.add(index)
                    self.streaming = len(self._answered) == len(self._tasks)
                    self._ever_streamed |= self.streaming
                    if event is not None:
                        if heard is not None:
                            heard()
                        self._announce(event, clock)
                        pause = STREAM_PAUSE_FIRST_S
                    elif time.monotonic() - asked < STREAM_QUICK_EMPTY_S:
                        await asyncio.sleep(pause)
                        pause = min(STREAM_PAUSE_MAX_S, pause * 2)
            finally:
                await stream.close()
        except PyMongoError as exc:
            (log.warning if required else log.debug)("change streams unavailable, polling instead: %s", exc)
        finally:
            self._answered.discard(index)
            if self.streaming:  # no safety poll far off without every stream: poll from now on
                self.streaming = False
                self.failed()

    def _announce(self, event: dict[str, Any], clock: ServerClock) -> None:
        """Wake now, or by the due time the event carries (a delayed push, a nack's retry copy or release); note
        the partition it names, if any."""
        fields = {**((event.get("updateDescription") or {}).get("updatedFields") or {}),
                  **(event.get("fullDocument") or {})}
        due, partition = fields.get("due"), fields.get("pt")
        if isinstance(partition, int) and partition not in self._hinted:
            self._hinted.append(partition)
        if isinstance(due, dt.datetime):
            self.due(due if due.tzinfo else due.replace(tzinfo=dt.timezone.utc), clock)
        else:
            self.notify()

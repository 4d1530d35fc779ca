"""Waking idle consumers: a consumer claims when a wake-up says that a bucket may be claimable, not at every
``reserve``. Wake-ups: a local signal (pushes from the same queue object, hand-offs this consumer made);
change-stream events, where the server has them (an insert, a release, a group's hand-off), which carry the
bucket's due time; timers at due times the consumer knows of (such events, its own retry copies, and the next
due bucket, read after a claim that found nothing); and polls: without a stream every poll interval or
sooner (backing off from ``POLL_FIRST_S``), with one a slow jittered safety poll (``SAFETY_POLL_S``) for
what no event announces, while every stream answers (``STREAM_SILENT_S``). A wake-up may watch several
collections (a queue's buckets and its pause document), one change stream each. An event that names its bucket's
partition (``pt``) makes the next check look there first (``checking``). The same ``Wakeup`` paces the outbox
relay's passes and a stream reader's claims."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from bucketq.shell.clock import ServerClock
from bucketq.store.aio.base import raise_if_cancelled
from bucketq.store.aio.changes import STREAM_AWAIT_MS

log = logging.getLogger("bucketq")

POLL_FIRST_S = 0.01
# With a change stream working, a check for work that found none is repeated after a random time in this range
# unless a wake-up comes first: it catches what no event or timer announces (a bucket whose due time a consumer
# failed to read after a claim, one whose event a server lost): so it bounds the delay of a missed wake-up while
# the streams stay healthy. Jittered, so that the consumers of a fleet started together do not poll together.
# An idle consumer's cost: its claim and next-due read (and a clock resync, due every 300 s) once a poll.
SAFETY_POLL_S = (270.0, 330.0)
# A stream that answered no getMore for this long is taken as lost (a connection that hangs, with no error to say
# so): the consumer polls as without streams, and the stream is opened again at the next check. A healthy one
# answers at least once a ``STREAM_AWAIT_MS`` (and a pause, below).
STREAM_SILENT_S = 30.0
# Some servers (the test server among them) answer an empty change-stream getMore at once instead of waiting
# maxAwaitTimeMS; after an empty answer the next getMore goes no sooner than a pause after the last one was asked,
# from STREAM_PAUSE_FIRST_S, doubling while the stream stays empty up to the wait of a server that holds it
# (STREAM_AWAIT_MS), and back to the first after an event: about one getMore a second while idle, as against
# a server that holds it, however long the answer took. (The test server scans its whole oplog for each one: a
# slow answer must not be followed by another at once.)
STREAM_PAUSE_FIRST_S = 0.04
# A queue's buckets are watched to wake consumers that wait: while none of a process's waits (all busy serving),
# the shared stream asks no getMore, for up to this long (a cursor left unread for ten minutes is closed by the
# server); the events of that time wait in the stream and come with its next answer, once one waits again.
FEED_REST_MAX_S = 60.0
STREAM_PAUSE_MAX_S = STREAM_AWAIT_MS / 1000

Watch = Callable[[Timestamp], Awaitable[Any]]  # a store's method that opens a change stream from a cluster time


@dataclass(frozen=True)
class Shared:
    """A watch whose change stream the wake-ups of one process (event loop) share, one per ``key`` (a queue's
    buckets or its ``Q.control``, on one client): its answers go to each (``ChangeFeed``). ``heard``, each
    wake-up's own, is called at each event and when the stream opened, before the wake-up. A ``key`` of None:
    a stream of the wake-up's own. ``spread``: an event that calls for a claim now wakes one of the wake-ups
    waiting (in turn), not all (``ChangeFeed``): a queue's buckets, where one bucket needs one claim."""

    key: Hashable
    watch: Watch
    heard: Callable[[], None] | None = None
    spread: bool = False


# A watch, or a watch and what to call at each of its events before the wake-up (a pause gate's ``changed``), or
# a share of a stream
Watched = Watch | tuple[Watch, Callable[[], None]] | Shared


class Wakeup:
    """When the next check for work (a claim, a relay pass) is called for: ``ready``, and ``wait`` until it is."""

    def __init__(self, poll_interval: float) -> None:
        self._changed = asyncio.Event()  # set when _woken or _check_at changes: a waiter looks again
        self._woken = False  # a wake-up came since the last check began
        self.waiting = 0  # the tasks in ``wait`` now
        self._check_at = float("-inf")  # monotonic time of the next poll or known due time
        self._poll_cap = poll_interval
        self._next_poll = POLL_FIRST_S
        self._hinted: list[int] = []  # partitions that events named since the last check began, first first
        self.streaming = False  # every change stream watched answered and none was lost since
        self._answered: dict[int, float] = {}  # the watches (by index) whose stream answered: when, monotonic
        self._ever_streamed = False
        self._feeds: list[tuple[ChangeFeed, _Listener]] = []  # per watch: its feed, and this wake-up's share
        # No watch started yet, or one ended since (set when a feed ends): ``start_stream`` has work.
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
        self.waiting += 1
        now = time.monotonic()
        for index, (feed, _) in enumerate(self._feeds):
            if feed.resting and index in self._answered:  # not silent: nobody asked it while this one was busy
                self._answered[index] = now
            feed.wanted()
        try:
            await self._wait(limit)
        finally:
            self.waiting -= 1

    async def _wait(self, limit: float) -> None:
        end = time.monotonic() + limit
        while not self.ready:
            if self.streaming:
                self._check_health()
                if not self.streaming:
                    continue  # polling from now on: a check may be due
            delay = min(end, self._check_at) - time.monotonic()
            if delay <= 0:
                return
            if self.streaming:  # wake in time to notice a stream gone silent
                delay = min(delay, STREAM_SILENT_S / 3)
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), delay)

    def start_stream(self, watches: Watched | list[Watched], clock: ServerClock, required: bool) -> None:
        """Start watching (``watches``: one change stream each, or a share of one: ``Shared``), or start again a
        stream that was lost after streams worked (a server restart). Called with the same watches each time; a
        no-op unless ``stream_start_due``."""
        if not self.stream_start_due:
            return
        listed = watches if isinstance(watches, list) else [watches]
        if not self._feeds:
            self._feeds = [self._join(i, w, clock, required) for i, w in enumerate(listed)]
        elif self._ever_streamed:
            for i, (feed, _) in enumerate(self._feeds):
                if feed.ended:
                    self._feeds[i] = self._join(i, listed[i], clock, required)
        else:  # a watch ended before streams ever worked: polling it is (asked again at the next call)
            return
        self.stream_start_due = False

    def _join(self, index: int, watched: Watched, clock: ServerClock,
              required: bool) -> tuple[ChangeFeed, _Listener]:
        shared = watched if isinstance(watched, Shared) else Shared(None, *(
            watched if isinstance(watched, tuple) else (watched, None)))
        listener = _Listener(self, index, shared.heard, clock)
        feed = ChangeFeed.of(shared.key, shared.watch, clock, required, spread=shared.spread)
        feed.join(listener)
        return feed, listener

    def _check_health(self) -> None:
        """Take a stream that has not answered for ``STREAM_SILENT_S`` as lost: poll from now on, and end its
        feed (for every wake-up that shares it), so that the next check opens it again (``start_stream``)."""
        silent_since = time.monotonic() - STREAM_SILENT_S
        for index, answered_at in list(self._answered.items()):
            if answered_at < silent_since:
                log.warning("a change stream has not answered for %g s: polling instead", STREAM_SILENT_S)
                self._lost(index)
                self._feeds[index][0].end()

    def _lost(self, index: int) -> None:
        """The stream of watch ``index`` ended or fell silent."""
        self._answered.pop(index, None)
        self.stream_start_due = True
        if self.streaming:  # no safety poll far off without every stream: poll from now on
            self.streaming = False
            self.failed()

    def _answered_by(self, index: int) -> None:
        self._answered[index] = time.monotonic()
        self.streaming = len(self._answered) == len(self._feeds)
        self._ever_streamed |= self.streaming

    @property
    def watching(self) -> bool:
        """Whether a change stream is open or being opened."""
        return any(not feed.ended for feed, _ in self._feeds)

    async def stop(self) -> None:
        feeds, self._feeds = self._feeds, []
        await asyncio.gather(*(feed.leave(listener) for feed, listener in feeds))
        self.stream_start_due = True
        self._answered.clear()
        self.streaming = False

    @property
    def idle(self) -> bool:
        """Whether a task waits here and no wake-up is on its way to it: the one to wake for a bucket."""
        return self.waiting > 0 and not self.ready

    def _announce(self, event: dict[str, Any], clock: ServerClock) -> None:
        """Wake now, or by the due time the event carries (a delayed push, a nack's retry copy or release); note
        the partition it names, if any."""
        due, partition = _fields(event)
        if isinstance(partition, int) and partition not in self._hinted:
            self._hinted.append(partition)
        if due is not None:
            self.due(due, clock)
        else:
            self.notify()


def _fields(event: dict[str, Any]) -> tuple[dt.datetime | None, Any]:
    """The due time (aware) and the partition an event carries, either possibly None."""
    fields = {**((event.get("updateDescription") or {}).get("updatedFields") or {}),
              **(event.get("fullDocument") or {})}
    due = fields.get("due")
    if not isinstance(due, dt.datetime):
        return None, fields.get("pt")
    return (due if due.tzinfo else due.replace(tzinfo=dt.timezone.utc)), fields.get("pt")


class _Listener:
    """A wake-up's share of a feed: its watch ``index`` among the wake-up's."""

    def __init__(self, wakeup: Wakeup, index: int, heard: Callable[[], None] | None, clock: ServerClock) -> None:
        self._wakeup = wakeup
        self._index = index
        self._heard = heard
        self._clock = clock

    @property
    def idle(self) -> bool:
        return self._wakeup.idle

    @property
    def waits(self) -> bool:
        return self._wakeup.waiting > 0

    def opened(self) -> None:
        if self._heard is not None:  # what was read before may be older than the stream's first event: read again
            self._heard()

    def answered(self, event: dict[str, Any] | None) -> None:
        self._wakeup._answered_by(self._index)
        if event is not None:
            if self._heard is not None:
                self._heard()
            self._wakeup._announce(event, self._clock)

    def ended(self) -> None:
        self._wakeup._lost(self._index)


# The feeds shared in each event loop, by key: one change stream per watched collection per process.
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, ChangeFeed]] = \
    weakref.WeakKeyDictionary()


class ChangeFeed:
    """One change stream, read in a loop by a task of its own, each answer (an event, or None: an empty getMore)
    handed to every listener; when it ends (an error, ``end``), each listener hears of it and the feed is done
    with (``ended``): the next ``of`` opens a new one. Shared by key (``of``), it ends with its last listener."""

    def __init__(self, key: Hashable, watch: Watch, clock: ServerClock, required: bool, *,
                 spread: bool = False) -> None:
        self._key = key
        self._clock = clock
        self._spread = spread
        self._turn = 0  # where the search for an idle listener to wake starts (``spread``)
        self._listeners: list[_Listener] = []
        self._open = False
        self.ended = False
        self._answered = False  # the stream answered a getMore
        self.resting = False  # a ``spread`` feed that asks nothing while no listener waits (``FEED_REST_MAX_S``)
        self._wanted = asyncio.Event()  # set when a listener begins to wait
        self._task = asyncio.get_running_loop().create_task(self._run(watch, clock, required), name="bucketq-watch")

    @classmethod
    def of(cls, key: Hashable, watch: Watch, clock: ServerClock, required: bool, *,
           spread: bool = False) -> ChangeFeed:
        """The feed of ``key`` in the running event loop, opened now unless one is open; a private one for a
        ``key`` of None."""
        if key is None:
            return cls(None, watch, clock, required, spread=spread)
        feeds = _SHARED.setdefault(asyncio.get_running_loop(), {})
        feed = feeds.get(key)
        if feed is None or feed.ended:
            feed = feeds[key] = cls(key, watch, clock, required, spread=spread)
        return feed

    def join(self, listener: _Listener) -> None:
        self._listeners.append(listener)
        if self._open:
            listener.opened()
        if self._answered:  # it may rest now: its last answer stands for one to the newcomer
            listener.answered(None)

    async def leave(self, listener: _Listener) -> None:
        """``listener`` stops listening; the feed ends (and this waits for its task) once none is left."""
        if listener in self._listeners:
            self._listeners.remove(listener)
        if not self._listeners:
            self._forget()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def end(self) -> None:
        """End the feed now (a stream gone silent): every listener hears of it."""
        self._task.cancel()

    def wanted(self) -> None:
        """A listener begins to wait: a resting feed asks again."""
        self._wanted.set()

    async def _rest(self) -> None:
        """With ``spread`` (a queue's buckets), while no listener waits: ask nothing until one does, or for
        ``FEED_REST_MAX_S`` at most."""
        if not self._spread or not self._answered or any(listener.waits for listener in self._listeners):
            return  # (its first answer tells each listener that the stream works: it comes first)
        self.resting = True
        self._wanted.clear()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), FEED_REST_MAX_S)
        finally:
            self.resting = False

    def _one_to_wake(self, event: dict[str, Any] | None) -> _Listener | None:
        """With ``spread``, for an event that calls for a claim now: the next listener in turn whose wake-up is
        idle (a task waits there, no wake-up on its way), which alone hears of it (the others hear an empty
        answer: their stream works); None: every listener hears of it (an event due later sets each one's
        timer; none idle: each claims at its next reserve)."""
        if not self._spread or event is None or len(self._listeners) < 2:
            return None
        # Due later only if it is for sure: a bucket pushed now is due at the server's time of its push, which
        # the earliest reading would put in the future by the clock's error, and every listener would hear it.
        due, _ = _fields(event)
        if due is not None and due > self._clock.latest():
            return None
        count = len(self._listeners)
        for step in range(count):
            listener = self._listeners[(self._turn + step) % count]
            if listener.idle:
                self._turn = (self._turn + step + 1) % count
                return listener
        return None

    def _forget(self) -> None:
        self.ended = True
        feeds = _SHARED.get(self._task.get_loop(), {})
        if self._key is not None and feeds.get(self._key) is self:
            del feeds[self._key]

    async def _run(self, watch: Watch, clock: ServerClock, required: bool) -> None:
        # startAtOperationTime spares a server round trip and is needed by servers (such as the test server)
        # that leave operationTime out of their replies; a second back covers a small clock error.
        start = Timestamp(int(clock.now().timestamp()) - 1, 0)
        try:
            stream = await watch(start)
            self._open = True
            for listener in list(self._listeners):
                listener.opened()
            try:
                pause = STREAM_PAUSE_FIRST_S
                while True:
                    await self._rest()
                    asked = time.monotonic()
                    event = await stream.try_next()
                    raise_if_cancelled()  # a cancel the driver swallowed: leave() waits for this task
                    self._answered = True
                    woken = self._one_to_wake(event)
                    for listener in list(self._listeners):
                        listener.answered(event if woken is None or listener is woken else None)
                    if event is not None:
                        pause = STREAM_PAUSE_FIRST_S
                    else:
                        wait = asked + pause - time.monotonic()
                        if wait > 0:
                            await asyncio.sleep(wait)
                        pause = min(STREAM_PAUSE_MAX_S, pause * 2)
            finally:
                await stream.close()
        except PyMongoError as exc:
            (log.warning if required else log.debug)("change streams unavailable, polling instead: %s", exc)
        finally:
            self._forget()
            for listener in list(self._listeners):
                listener.ended()

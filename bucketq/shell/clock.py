"""The server's clock, as seen from this host.

Due times and leases are compared against ``now()``: the server's ``isMaster.localTime`` measured at the
last sync, advanced by this host's *monotonic* clock since then. The host's wall clock is never read, so an
NTP step or a manual change of it cannot make fresh leases look expired (or eternal).

A reading is only known within ``error()``: half the round trip of the sync (the server read its clock some
time between our request and its reply) plus the millisecond of ``localTime``, growing by ``MAX_DRIFT``
since. On a loaded host or server a round trip can take seconds, so two hosts' readings can differ by that
much. Lease decisions therefore take the side of the error that cannot overlap: a claim judges another's lease
expired only by ``earliest()``, and a holder serves only while ``latest()`` is short of its lease's end. See
docs/FORMAT.md ("Clocks").
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

import pymongo

from bucketq.core.format import UTC, as_utc

RESYNC_EVERY_S = 300.0
# A reading whose error is above this is refined sooner: a sync made while the server or the host was busy.
REFINE_ABOVE_S = 0.02
REFINE_EVERY_S = 10.0
MAX_DRIFT = 1e-4  # how fast this host's monotonic clock may gain or lose on the server's clock (100 ppm)
LOCAL_TIME_RESOLUTION_S = 0.001


def anchor(sent_mono: float, received_mono: float, server_time: Any) -> tuple[float, float] | None:
    """``(server seconds since the epoch, monotonic seconds)`` at the same instant, from one round trip sent
    and received at the given monotonic times; None when the reply carries no server time."""
    if not isinstance(server_time, dt.datetime):
        return None
    return as_utc(server_time).timestamp(), (sent_mono + received_mono) / 2


class ServerClock:
    def __init__(self) -> None:
        # Until the first sync: this host's wall clock, read once, then advanced monotonically.
        self._server_s = time.time()
        self._mono_s = time.monotonic()
        self._error_s = 0.0  # at _mono_s; unknown until the first sync, which replaces it whatever it is
        self._synced_at: float | None = None
        self._fresh_for = RESYNC_EVERY_S  # how long a sync lasts (``stale``): shorter while the error is large
        # The last reading, as (millisecond, datetime): a busy consumer reads the clock once a message, and one
        # datetime a millisecond is all it needs. One attribute, so that threads never pair a stale datetime
        # with a fresh millisecond.
        self._last: tuple[int, dt.datetime] = (-1, dt.datetime.fromtimestamp(0, UTC))
        # The same for latest(), which a consumer reads before serving each message, as (the monotonic time until
        # which it holds, millisecond, datetime): a reading within that time needs neither arithmetic nor a datetime.
        self._last_latest: tuple[float, int, dt.datetime] = (-math.inf, -1, self._last[1])

    def now(self) -> dt.datetime:
        """The server's clock as best estimated, to the millisecond; never earlier than a previous reading."""
        # BSON dates have millisecond precision: truncate here so what we compare is what is stored.
        ms = int((self._server_s + (time.monotonic() - self._mono_s)) * 1000)
        last = self._last
        # Never earlier than a reading already given: a resync may move the estimate back within its error,
        # and a due time written by one call must not be in the future for the next (a release then a claim).
        if last[0] < ms:
            last = self._last = (ms, dt.datetime.fromtimestamp(ms / 1000, UTC))
        return last[1]

    def error(self) -> dt.timedelta:
        """How far ``now()`` may be from the server's clock, either way."""
        return dt.timedelta(seconds=self._error_at(time.monotonic()))

    def earliest(self) -> dt.datetime:
        """The earliest the server's clock can read now: what a claim compares another's lease with."""
        return self.now() - self.error()

    def latest(self) -> dt.datetime:
        """The latest the server's clock can read now: what a holder compares its own lease with. Rounded up to
        the millisecond (never earlier than the exact reading), so that one datetime a millisecond will do."""
        mono = time.monotonic()
        last = self._last_latest
        if mono < last[0]:  # the exact reading has not passed the millisecond given last
            return last[2]
        since = mono - self._mono_s  # now() plus _error_at(), written out
        base = self._server_s + self._error_s
        ms = math.ceil((base + since + MAX_DRIFT * abs(since)) * 1000)
        # The exact reading grows by 1 + MAX_DRIFT seconds a second from the anchor on: it reaches ms at `until`.
        # Ten microseconds are kept in hand for the rounding of floats (about 0.2 µs an operation at an epoch's size).
        until = self._mono_s + (ms / 1000 - base) / (1 + MAX_DRIFT) - 1e-5 if since >= 0 else -math.inf
        moment = last[2] if last[1] == ms else dt.datetime.fromtimestamp(ms / 1000, UTC)
        self._last_latest = (until, ms, moment)
        return moment

    def _anchor(self, server_s: float, mono_s: float, error_s: float) -> None:
        """Take a reading: ``server_s`` seconds since the epoch on the server's clock, within ``error_s``, at
        ``mono_s`` on this host's monotonic clock. What latest() kept of the previous one goes."""
        self._server_s, self._mono_s, self._error_s = server_s, mono_s, error_s
        self._last_latest = (-math.inf, -1, self._last_latest[2])

    def _error_at(self, mono: float) -> float:
        return self._error_s + MAX_DRIFT * abs(mono - self._mono_s)

    @property
    def stale(self) -> bool:
        """Due for a sync: never synced, synced RESYNC_EVERY_S ago, or REFINE_EVERY_S ago with an error above
        REFINE_ABOVE_S. Asked before every reserve: one comparison with the span set at the last sync."""
        return self._synced_at is None or time.monotonic() - self._synced_at > self._fresh_for

    async def sync(self, database: Any, within_s: float | None = None) -> None:
        """Measure the server clock with one ``isMaster`` round trip (async clients), given up after ``within_s``
        if given, finding a server included: it is a queue's first contact with the server, where a wrong address
        shows, and the driver's own server selection waits 30 s unless the URI says otherwise."""
        sent = time.monotonic()
        with pymongo.timeout(within_s):
            reply = await database.client.admin.command("isMaster")
        self._take(sent, time.monotonic(), reply)

    def sync_blocking(self, database: Any, within_s: float | None = None) -> None:
        """The same for a synchronous ``Database`` (the Spark driver's shells; also ``bucketq.memory``'s
        ``SyncDatabase``): ``isMaster`` runs on any database."""
        sent = time.monotonic()
        with pymongo.timeout(within_s):
            reply = database.command("isMaster")
        self._take(sent, time.monotonic(), reply)

    def _take(self, sent: float, received: float, reply: Any) -> None:
        point = anchor(sent, received, reply.get("localTime"))
        if point is not None:
            error = (received - sent) / 2 + LOCAL_TIME_RESOLUTION_S
            carried, carried_error = self._server_s + (point[1] - self._mono_s), self._error_at(point[1])
            if self._synced_at is None or abs(carried - point[0]) > carried_error + error:
                # The first sync replaces the host's guess, and a stepped server clock is followed: both may
                # go back in time, past what now() has already read.
                self._anchor(point[0], point[1], error)
                self._last = (-1, self._last[1])
            else:
                server_s, error_s = combine(carried, carried_error, point[0], error)
                self._anchor(server_s, point[1], error_s)
        self._synced_at = time.monotonic()
        self._fresh_for = REFINE_EVERY_S if self._error_s > REFINE_ABOVE_S else RESYNC_EVERY_S


def combine(old_s: float, old_error_s: float, new_s: float, new_error_s: float) -> tuple[float, float]:
    """``(estimate, error)`` of the server's clock from the previous reading carried forward and a new one, at
    the same instant, when their intervals overlap: the overlap, so that a sync slowed down by load cannot
    widen a good reading."""
    low, high = max(old_s - old_error_s, new_s - new_error_s), min(old_s + old_error_s, new_s + new_error_s)
    return (low + high) / 2, (high - low) / 2

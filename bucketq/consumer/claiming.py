"""The consumer's claims: one due bucket at a time, one bucket ahead while the queue has a backlog, and the wake-up
when the next bucket falls due. What a claim's reply decides (partitions in turn, quarantine, the ordered group's
turn, cancelled messages, known dedupe keys) is the claim step's (``core.claim_step``), which this part carries to
the store, decoding the bucket when the step asks to open it."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pymongo.errors import PyMongoError

from bucketq.codecs import Codec, codec_for
from bucketq.consumer.decoding import Decoding
from bucketq.consumer.holding import Holding
from bucketq.core import claim_step
from bucketq.core.claim_step import Claimed, Claimer, ClaimStep, Opened, Outcome
from bucketq.core.conversation import carry_async
from bucketq.core.format import StoredBucket
from bucketq.core.group_turn import GroupStep
from bucketq.core.held import ClaimedBucket
from bucketq.core.priorities import Turns
from bucketq.core.sharding import Rotation
from bucketq.errors import MalformedBucket
from bucketq.shell.clock import ServerClock
from bucketq.shell.pause_gate import PAUSE_REFRESH_S, PauseGate
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")

# A bucket holding this many messages was written under load (group commit writes smaller ones when producers
# trickle): the first claim that takes one already counts as a backlog for claiming ahead.
BACKLOG_BUCKET_SIZE = 64


class Backlog:
    """Whether the queue likely holds another bucket behind the newest one claimed, from the claims in a row that
    took a bucket (``found_in_a_row``, which ``Claiming`` counts): from two on (or one of a bucket written under
    load, see BACKLOG_BUCKET_SIZE), the queue has a backlog and claiming ahead pays. A consumer that empties each
    bucket before the next is written alternates found and empty claims, and claiming ahead would only add an
    empty claim per bucket."""

    def __init__(self) -> None:
        self.found_in_a_row = 0

    def likely(self, newest: ClaimedBucket) -> bool:
        """Whether the queue likely holds another bucket behind ``newest``, the newest one claimed."""
        return self.found_in_a_row >= 2 or (self.found_in_a_row == 1 and newest.bucket.size >= BACKLOG_BUCKET_SIZE)


class Claiming:
    """Claims for the consumer whose claim step is ``claimer``: the buckets taken join ``holdings`` (the consumer's
    list, shared with the other parts), opened by ``decoding``, a finished one flushed (``schedule_flush``); an
    ordered group's turn carried by ``group_step`` (``OrderedGroupTurns.step``). ``before_claim`` is the queue's
    set-up, due before each claim; ``pause`` the queue's pause gate. One claim at a time (``lock``), and at most
    one claim ahead (``ahead``) while the queue has a ``backlog``, spawned by ``spawn``, none once ``draining``."""

    def __init__(self, store: AsyncQueueStore, codec: Codec, clock: ServerClock, wakeup: Wakeup, pause: PauseGate,
                 holdings: list[Holding], *, claimer: Claimer, turns: Turns, backlog: Backlog, decoding: Decoding,
                 before_claim: Callable[[], Awaitable[None]], group_step: Callable[[GroupStep], Awaitable[Any]],
                 schedule_flush: Callable[[Holding], None],
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]],
                 draining: Callable[[], bool]) -> None:
        self._store = store
        self._codec = codec
        self._clock = clock
        self._wakeup = wakeup
        self._pause = pause
        self._holdings = holdings
        self._claimer = claimer
        self._rotation = Rotation()
        self._turns = turns
        self._backlog = backlog
        self._decoding = decoding
        self._before_claim = before_claim
        self._group_step = group_step
        self._schedule_flush = schedule_flush
        self._spawn = spawn
        self._draining = draining
        self.lock = asyncio.Lock()  # one claim in flight at a time: a reserve's, or the claim ahead
        self.ahead: asyncio.Task[None] | None = None  # the claim ahead under way, if any
        self.ahead_unsent = False  # it is spawned and its claim's request is not sent yet (see Consumer.reserve)
        # Claims that took a bucket (True) or found none (False), for the bench's measure of claim conflicts
        self.claim_counts: Counter[bool] = Counter()

    async def _wake_when_due(self, expired_by: dt.datetime) -> None:
        """After a claim that found nothing, with a change stream (so that no poll comes soon): wake when the
        next bucket becomes due or its lease ends. One read, served by the ``due`` index. Events announce the
        buckets written later; a lease extended meanwhile costs one claim that finds nothing, and a read.
        After ``expired_by``, the claim's earliest reading of the server's clock: a lease that ended by its
        latest reading is not over for a claim yet (a slow clock read on a loaded server: seconds)."""
        try:
            due = await self._store.next_due(expired_by)
        except PyMongoError as exc:  # the safety poll comes anyway
            log.debug("reading the next due time failed: %s", exc)
            return
        if due is not None:
            self._wakeup.due(due, self._clock)

    def start_ahead(self, newest: Holding) -> None:
        """Start the claim ahead of the bucket after ``newest``, the newest one held (``_claim_ahead``)."""
        self.ahead = self._spawn(self._claim_ahead(newest))
        self.ahead_unsent = True

    async def _claim_ahead(self, newest: Holding) -> None:
        """Claim the next bucket as soon as the newest one held (``newest``) is being served, so that consumers
        find messages at hand when it runs out instead of all waiting for a claim's round trip. At most one
        bucket ahead, only while the queue has a backlog (``Backlog``: an idle queue or a trickle costs
        no extra commands), and never two claims at once: it starts only while no reserve is claiming, and a
        reserve that needs to claim first waits for it (``ahead_landed``), as does a drain."""
        try:
            if self._draining() or not self._holdings or self._holdings[-1] is not newest:
                return
            await self._before_claim()
            await self.claim()
        except Exception as exc:  # the next reserve that finds nothing at hand claims again, and raises
            log.warning("claim ahead failed: %s", exc)
        finally:
            self.ahead_unsent = False

    async def ahead_landed(self) -> None:
        """Wait for the claim ahead under way, if any: its bucket is held afterwards."""
        if self.ahead is not None and not self.ahead.done():
            await asyncio.wait([self.ahead])

    async def claim(self, only: dict | None = None) -> bool:
        """Claim one due bucket (``only``: the bucket of that shard key, if due) and follow its claim up: the claim
        step (``core.claim_step``), carried to the store. Returns whether a bucket was taken (even one that went to
        quarantine or had to wait for its group)."""
        hinted = self._wakeup.checking() if only is None else []
        claimed = await carry_async(claim_step.claim(self._claimer, self._rotation, self._turns, hinted=hinted,
                                                     only=only, groups_held=self._ordered_groups_held()),
                                    self._claim_step)
        if claimed.outcome is Outcome.NONE_DUE and self._wakeup.streaming and only is None:
            assert claimed.expired_by is not None
            await self._wake_when_due(claimed.expired_by)
        made: Claimed | None = claimed
        while made is not None:  # the claim, and the one made instead of it (an ordered group was free)
            if made.outcome is Outcome.NONE_DUE:
                self._backlog.found_in_a_row = 0
            elif made.taken and made.outcome is not Outcome.UNCLAIMABLE:
                self._backlog.found_in_a_row += 1
            made = made.instead
        return claimed.taken

    async def _claim_step(self, step: ClaimStep) -> Any:
        """One step of the claim step's conversation, carried to the store; an ordered group's turn to
        ``OrderedGroupTurns.step``."""
        match step:
            case claim_step.ReadPause():  # paused by an operator (Queue.pause): held buckets are still served
                paused = await self._pause.holds(watched=self._wakeup.streaming)
                if paused and not self._wakeup.streaming:  # no event tells of a resume: read again
                    self._wakeup.due_at(time.monotonic() + PAUSE_REFRESH_S)
                return paused
            case claim_step.ReadClock():
                return self._clock.now(), self._clock.earliest()
            case claim_step.ReadPartitions():
                return await self._store.partition_count()  # the queue's, learned at set-up
            case claim_step.Claim(spec):
                # A claim ahead's request goes out in this step (unless the pool must open a connection first). Until
                # here, reserves yield for it (Consumer.reserve): the pause read may have waited for a reply.
                self.ahead_unsent = False
                doc, unclaimable = await self._store.claim(spec)
                self.claim_counts[doc is not None] += 1
                if doc is not None:
                    self._wakeup.hit()
                return doc, unclaimable
            case claim_step.Quarantine(doc, token, reason):
                await self._decoding.quarantine_bucket(doc, token, reason)
                return True
            case claim_step.Open(bucket):
                return self._open(bucket)
            case claim_step.ReadKnownKeys(keys):
                return await self._store.known_keys(keys)
            case claim_step.Hold(held, opened):
                holding = Holding(held, opened.payloads, opened.load)
                self._holdings.append(holding)
                if held.finished:
                    self._schedule_flush(holding)
                return None
        return await self._group_step(step)

    def _open(self, bucket: StoredBucket) -> Opened | str:
        """The claim step's ``Open``: the bucket's codec, and its payloads decoded, or why it cannot be read."""
        try:
            codec = codec_for(bucket.codec, self._codec)
        except (MalformedBucket, ValueError) as exc:
            return str(exc)
        if bucket.checked:
            # A bucket its writer checked is decoded a payload at a time as it is served (``_next_message``):
            # decoding it whole here would keep a thousand new objects alive, which sets off the collector once a
            # bucket.
            return Opened(bucket.payloads, load=codec.load)
        payloads, bad = self._decoding.decode(bucket, codec)
        return Opened(payloads, bad)

    def _ordered_groups_held(self) -> list[str]:
        """The ordered groups whose turn this consumer holds: their later buckets can only wait for it to end."""
        return [h.held.bucket.group for h in self._holdings if h.held.bucket.group is not None and not h.held.ended]

    async def claims_landed(self) -> None:
        """Wait for a claim under way (a reserve's or the claim ahead): its bucket is held afterwards."""
        async with self.lock:
            await self.ahead_landed()

"""The consumer's claims: one due bucket at a time, partitions in turn, one bucket ahead while the queue has a
backlog, and the wake-up when the next bucket falls due; a claimed bucket is decoded, its ordered group's turn taken and
its known dedupe keys skipped before its messages are served."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

from pymongo.errors import PyMongoError

from bucketq.codecs import codec_for
from bucketq.consumer.holding import Holding
from bucketq.consumer.state import ConsumerState
from bucketq.core import claims, group_turn, groups
from bucketq.core.format import parse_bucket
from bucketq.core.held import ClaimedBucket, SlotState
from bucketq.errors import MalformedBucket
from bucketq.shell.pause_gate import PAUSE_REFRESH_S

log = logging.getLogger("bucketq")

# A bucket holding this many messages was written under load (group commit writes smaller ones when producers
# trickle): the first claim that takes one already counts as a backlog for claiming ahead.
BACKLOG_BUCKET_SIZE = 64


class Claiming(ConsumerState):
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

    async def _claim_ahead(self, newest: Holding) -> None:
        """Claim the next bucket as soon as the newest one held (``newest``) is being served, so that consumers
        find messages at hand when it runs out instead of all waiting for a claim's round trip. At most one
        bucket ahead, only while the queue has a backlog (``_found_in_a_row``: an idle queue or a trickle costs
        no extra commands), and never two claims at once: it starts only while no reserve is claiming, and a
        reserve that needs to claim first waits for it (``_ahead_landed``), as does a drain."""
        try:
            if self._draining or not self._holdings or self._holdings[-1] is not newest:
                return
            await self._before_claim()
            await self._claim()
        except Exception as exc:  # the next reserve that finds nothing at hand claims again, and raises
            log.warning("claim ahead failed: %s", exc)
        finally:
            self._ahead_unsent = False

    def _backlog(self, newest: ClaimedBucket) -> bool:
        """Whether the queue likely holds another bucket behind ``newest``, the newest one claimed."""
        return self._found_in_a_row >= 2 or (self._found_in_a_row == 1 and newest.bucket.size >= BACKLOG_BUCKET_SIZE)

    async def _ahead_landed(self) -> None:
        """Wait for the claim ahead under way, if any: its bucket is in ``_holdings`` afterwards."""
        if self._ahead is not None and not self._ahead.done():
            await asyncio.wait([self._ahead])

    async def _claim(self, only: dict | None = None) -> bool:
        """Claim one due bucket (``only``: the bucket of that shard key, if due), trying the partitions in turn
        (``sharding.Rotation``: each at most once). Returns whether a bucket was taken (even one that went to
        quarantine or had to wait for its group)."""
        hinted = self._wakeup.checking() if only is None else []
        # paused by an operator (Queue.pause): held buckets are still served
        if await self._store.pause.holds(watched=self._wakeup.streaming):
            if not self._wakeup.streaming:  # no event tells of a resume: read again
                self._wakeup.due_at(time.monotonic() + PAUSE_REFRESH_S)
            return False
        now, expired_by = self._clock.now(), self._clock.earliest()
        token = claims.new_token()
        ordered_groups_held = self._ordered_groups_held()
        doc = unclaimable = None
        sort = self._turns.sort()  # by priority, or by age to keep lower levels from starving
        partitions = await self._store.partition_count()  # the queue's, learned at set-up
        for partition in self._rotation.round(partitions, first=hinted) if only is None else [only["pt"]]:
            spec = groups.skip(claims.claim(now, self._options.lease, token, self._owner, expired_by=expired_by,
                                            partition=partition, sort=sort), ordered_groups_held)
            if only is not None:
                spec = groups.instead(spec, only)
            # A claim ahead's request goes out in this step (unless the pool must open a connection first). Until
            # here, reserves yield for it (Consumer.reserve): the pause read above may have waited for a reply.
            self._ahead_unsent = False
            doc, unclaimable = await self._store.claim(spec)
            self.claim_counts[doc is not None] += 1
            if doc is not None:
                self._rotation.claimed(partition)
                if only is None:
                    self._turns.took(sort)
                break
        if doc is not None and unclaimable is not None:
            self._wakeup.hit()
            await self._quarantine_bucket(doc, token, unclaimable)
            return True
        self._found_in_a_row = self._found_in_a_row + 1 if doc is not None else 0
        if doc is None:
            if self._wakeup.streaming and only is None:
                await self._wake_when_due(expired_by)
            return False
        self._wakeup.hit()
        try:
            bucket = parse_bucket(doc)
            codec = codec_for(bucket.codec, self._codec)
        except (MalformedBucket, ValueError) as exc:
            await self._quarantine_bucket(doc, token, str(exc))
            return True
        # A bucket its writer checked is decoded a payload at a time as it is served (``_next_message``): decoding
        # it whole here would keep a thousand new objects alive, which sets off the collector once a bucket.
        payloads, bad = (bucket.payloads, {}) if bucket.checked else self._decode(bucket, codec)
        if bad and self._options.malformed == "quarantine":
            first = ", ".join(f"slot {s}: {reason}" for s, reason in list(bad.items())[:3])
            await self._quarantine_bucket(doc, token, f"{len(bad)} undecodable message(s) ({first})")
            return True
        if bucket.group is not None:
            turn = await self._converse(group_turn.take_turn(bucket, token, now, self._policy.lease_from(now),
                                                             expired_by, waited=bool(doc.get("w"))))
            if not turn.serve:
                if only is None and turn.claim_instead is not None:
                    await self._claim(only=turn.claim_instead)  # the ordered group was free: serve its first
                return True
        held = ClaimedBucket(bucket, token, self._policy.lease_from(now), self._policy)
        holding = Holding(held, payloads, codec.load if bucket.checked else None)
        for slot, reason in bad.items():
            held.quarantine(slot, f"undecodable: {reason}")
        if self._options.dedupe:
            await self._skip_known_keys(holding)
        self._holdings.append(holding)
        if held.finished:
            self._schedule_flush(holding)
        return True

    def _ordered_groups_held(self) -> list[str]:
        """The ordered groups whose turn this consumer holds: their later buckets can only wait for it to end."""
        return [h.held.bucket.group for h in self._holdings if h.held.bucket.group is not None and not h.held.ended]

    async def _skip_known_keys(self, holding: Holding) -> None:
        held = holding.held
        keyed = {k: s for s, k in enumerate(held.bucket.keys) if k is not None and held.state[s] is SlotState.PENDING}
        known = await self._store.known_keys(list(keyed))
        for key in known:
            held.ack(keyed[key])

    async def _claims_landed(self) -> None:
        """Wait for a claim under way (a reserve's or the claim ahead): its bucket is in ``_holdings`` after."""
        async with self._claim_lock:
            await self._ahead_landed()

"""A claimed bucket's payloads decoded, and a bucket that cannot be served (malformed, undecodable, unclaimable)
sent to quarantine."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bucketq.codecs import Codec
from bucketq.consumer.holding import Holding
from bucketq.core.format import StoredBucket, quarantined_bucket
from bucketq.core.sharding import key as shard_key
from bucketq.metrics import Metrics
from bucketq.shell.clock import ServerClock
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")


class Decoding:
    """Decodes the buckets claimed by consumer ``owner``, and quarantines what cannot be served (written to
    ``store``, counted in ``metrics``); a bucket whose last message went to quarantine is flushed
    (``schedule_flush``)."""

    def __init__(self, store: AsyncQueueStore, clock: ServerClock, owner: str, metrics: Metrics,
                 schedule_flush: Callable[[Holding], None]) -> None:
        self._store = store
        self._clock = clock
        self._owner = owner
        self._metrics = metrics
        self._schedule_flush = schedule_flush

    def undecodable(self, holding: Holding, slot: int, exc: Exception) -> None:
        """A payload of a bucket its writer checked failed to decode as it was served: that message alone goes to
        quarantine, as with ``malformed="skip"``; the rest of the bucket is served."""
        held = holding.held
        reason = _failure(exc)
        log.warning("message %s of bucket %s (marked checked) could not be decoded, quarantined: %s",
                    held.bucket.message_id(slot), held.bucket.id, reason)
        held.quarantine(slot, f"undecodable: {reason}")
        if held.finished:
            self._schedule_flush(holding)

    def decoded(self, holding: Holding, slots: list[int]) -> tuple[list[int], list[Any]]:
        """A served batch of a bucket its writer checked, decoded one at a time (one failed): the slots whose payload
        decodes, with their payloads; each that fails goes to quarantine (``undecodable``)."""
        assert holding.load is not None
        decoded, failed = _decode_each(holding.load, holding.payloads, slots)
        for slot, exc in failed.items():
            self.undecodable(holding, slot, exc)
        return list(decoded), list(decoded.values())

    def decode(self, bucket: StoredBucket, codec: Codec) -> tuple[list[Any], dict[int, str]]:
        """Each payload not done decoded (None for a done one), and the reason each undecodable one failed."""
        load, done = codec.load, bucket.done
        if not done:  # a bucket's first claim: all of it at C speed, unless a payload fails
            with contextlib.suppress(Exception):  # else one at a time below, to name each that fails
                return list(map(load, bucket.payloads)), {}
        decoded, failed = _decode_each(load, bucket.payloads, (s for s in range(bucket.size) if s not in done))
        return [decoded.get(slot) for slot in range(bucket.size)], {s: _failure(e) for s, e in failed.items()}

    async def quarantine_bucket(self, doc: dict, token: str, reason: str) -> None:
        """Send the claimed bucket ``doc`` (claimed with ``token``) to quarantine, for ``reason``."""
        now = self._clock.now()
        entry = quarantined_bucket(doc, reason=reason, at=now, host=self._owner.split(":")[0], pid=os.getpid())
        ref = shard_key(doc)
        await self._store.quarantine_bucket(entry, ref, token, now)
        # reported once stored, not before: a copy refused (too large) must not read as quarantined
        log.warning("bucket %s quarantined%s: %s", doc.get("_id"),
                    f" without its fields {', '.join(entry['omitted'])} (over 16 MiB)" if "omitted" in entry else "",
                    reason)
        self._metrics.quarantined(1)


def _decode_each(load: Callable[[Any], Any], stored: Sequence[Any],
                 slots: Iterable[int]) -> tuple[dict[int, Any], dict[int, Exception]]:
    """The payload of each of ``slots`` decoded, one at a time, and what each that failed raised."""
    decoded: dict[int, Any] = {}
    failed: dict[int, Exception] = {}
    for slot in slots:
        try:
            decoded[slot] = load(stored[slot])
        except Exception as exc:
            failed[slot] = exc
    return decoded, failed


def _failure(exc: Exception) -> str:
    """A payload's failure to decode, as its quarantine entry names it."""
    return f"{type(exc).__name__}: {exc}"

"""Unique jobs (``push(key=..., unique_for=...)``): the producer holds the keys of a write's unique messages before
it inserts their buckets, and the consumer frees them once the messages are finished (``core.unique``)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from bucketq.core import unique
from bucketq.core.accumulator import SealedBucket
from bucketq.core.backoff import check_delay
from bucketq.core.format import StoredBucket
from bucketq.core.held import SlotState
from bucketq.errors import InvalidOption
from bucketq.store.aio.base import retrying
from bucketq.store.aio.queue_store import AsyncQueueStore
from bucketq.store.aio.stream_store import AsyncStreamStore

log = logging.getLogger("bucketq")


def unique_until(unique_for: float | dt.timedelta, key: str | None, now: dt.datetime) -> dt.datetime:
    """Until when a message pushed now with ``unique_for`` holds ``key`` at most; ``InvalidOption`` without a key
    or for anything but a positive number of seconds (or timedelta)."""
    if key is None:
        raise InvalidOption("unique_for needs a key: the job's uniqueness key")
    seconds = check_delay(unique_for)
    if not seconds:
        raise InvalidOption(f"unique_for must be positive, got {unique_for!r}")
    return now + dt.timedelta(seconds=seconds)


async def hold_keys(store: AsyncQueueStore | AsyncStreamStore, batch: list[SealedBucket], now: dt.datetime,
                    timeout_s: float) -> list[dict[str, Any]]:
    """Hold the keys of the unique messages of ``batch`` (retried); mark the messages whose key another live job
    holds done in their buckets, and resolve them to that job's id (``SealedBucket.merged``). Returns the
    documents left to insert (a bucket whose every message merged is not written)."""
    docs = [b.document for b in batch]
    holds = list(unique.holds(docs))
    if not holds:
        return docs
    assert isinstance(store, AsyncQueueStore)  # a stream's push takes no unique_for
    merged = await retrying(lambda _: store.hold_keys(holds, now), timeout_s=timeout_s)
    return merge_held(batch, merged)


def merge_held(batch: list[SealedBucket], merged: Mapping[unique.Hold, str]) -> list[dict[str, Any]]:
    """After the keys of ``batch`` were held (the store's ``hold_keys``, async or sync): each message merged into
    another job resolves to that job's id (``SealedBucket.merged``), and is marked done in its bucket. Returns the
    documents left to insert."""
    for hold, holder in merged.items():
        batch[hold.bucket].merged[hold.slot] = holder
    return unique.merge([b.document for b in batch], merged)


async def release_keys(store: AsyncQueueStore, bucket: StoredBucket, slots: Mapping[int, SlotState]) -> None:
    """Free the keys that the unique messages among ``slots`` of ``bucket`` (a flush's, just applied) hold, if
    they are finished (``unique.freed``). On failure the keys stay held until their ``until``: a later push of
    one is merged into a finished job meanwhile, as a log line says."""
    held = unique.freed(bucket, slots)
    if not held:
        return
    try:
        await store.release_keys(held)
    except Exception as exc:
        log.warning("unique keys %s of finished jobs stay held until they expire: %s", sorted(held), exc)

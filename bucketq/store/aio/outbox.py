"""``OutboxStore``: the outbox relay's commands on the application's source collection (async only). The
relay's writes to the queue go through the queue's own store (``AsyncQueueStore.insert_buckets``)."""

from __future__ import annotations

from typing import Any

from bson.codec_options import DatetimeConversion

from bucketq.core.format import UTC
from bucketq.store.aio.base import retrying
from bucketq.store.aio.changes import watch_events


class OutboxStore:
    def __init__(self, source: Any, field: str, *, op_timeout_s: float) -> None:
        # Dates (``at``) come back aware, in UTC; one beyond Python's datetime comes back as DatetimeMS and the
        # event is set aside instead of making every read of its document raise.
        self.source = source.with_options(codec_options=source.codec_options.with_options(
            tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO))
        self.field = field
        self.op_timeout_s = op_timeout_s

    async def waiting(self, limit: int) -> list[dict]:
        """Up to ``limit`` documents holding events, with ``_id`` and the events only."""
        return await self.source.find({f"{self.field}.0": {"$exists": True}}, {self.field: 1},
                                      limit=limit).to_list(None)

    async def remove(self, ops: list[Any]) -> None:
        """The pulls and set-asides that end a pass (``core.outbox_plan.removals``), all idempotent: retried."""
        await retrying(lambda _: self.source.bulk_write(ops, ordered=False), timeout_s=self.op_timeout_s)

    async def watch_events(self, start: Any) -> Any:
        """A change stream of the changes that leave events in a document (``changes.watch_events``)."""
        return await watch_events(self.source, self.field, start)

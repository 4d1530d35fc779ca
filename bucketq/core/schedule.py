"""A schedule's ticks, sans-I/O (``bucketq.schedule`` runs them): its cron expression and time zone checked, the
ticks to enqueue given the last one handled, the clock and the missed-ticks policy, and what makes each tick's
enqueue happen once however many schedulers race: its bucket's ``_id`` and partition, derived from the queue,
the schedule's name and the tick (docs/FORMAT.md, Schedules).

Cron expressions are read by cronsim (the healthchecks.io project's): maintained, pure Python, no
dependencies, and its DST handling is documented and is Debian cron's (a tick in a skipped hour fires at the
end of the gap; a daily tick in a repeated hour fires once, a tick that names no hour fires in both). croniter
was the other candidate; its maintainer announced its end in 2024 before it moved to a new home.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import zlib
import zoneinfo
from collections.abc import Iterator
from typing import Any, Literal

from bson import ObjectId

from bucketq.errors import InvalidOption

Missed = Literal["skip", "catch_up"]
MISSED_POLICIES = ("skip", "catch_up")
STATE_PREFIX = "schedule:"  # the ``_id`` of a schedule's state document in ``Q.control``


def load_cron() -> Any:
    """cronsim, or ``InvalidOption`` saying which extra installs it."""
    try:
        import cronsim
    except ImportError as exc:  # pragma: no cover - the schedule extra is installed in every test run
        raise InvalidOption("schedules need cronsim: pip install 'bucketq[schedule]'") from exc
    return cronsim


def check_schedule(expression: Any, tz: Any, missed: Any, catch_up_limit: Any, name: Any) -> zoneinfo.ZoneInfo:
    """The schedule's time zone; ``InvalidOption`` naming what is wrong with any argument."""
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"a schedule's name must be a non-empty string, got {name!r}")
    if missed not in MISSED_POLICIES:
        raise InvalidOption(f"missed must be one of {MISSED_POLICIES}, got {missed!r}")
    if isinstance(catch_up_limit, bool) or not isinstance(catch_up_limit, int) or catch_up_limit < 1:
        raise InvalidOption(f"catch_up_limit must be an int >= 1, got {catch_up_limit!r}")
    if not isinstance(tz, str):
        raise InvalidOption(f"tz must be a zoneinfo name such as 'Europe/Berlin', got {tz!r}")
    try:
        zone = zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidOption(f"unknown time zone {tz!r} (a zoneinfo name such as 'Europe/Berlin')") from exc
    if not isinstance(expression, str):
        raise InvalidOption(f"the cron expression must be a string, got {type(expression).__name__}")
    cronsim = load_cron()
    try:
        cronsim.CronSim(expression, dt.datetime(2000, 1, 1, tzinfo=zone))
    except cronsim.CronSimError as exc:
        raise InvalidOption(f"bad cron expression {expression!r}: {exc}") from exc
    return zone


def aware(now: dt.datetime) -> dt.datetime:
    """``now`` in UTC; ``InvalidOption`` for a naive datetime (its zone would be a guess)."""
    if not isinstance(now, dt.datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise InvalidOption(f"now must be a timezone-aware datetime, got {now!r}")
    return now.astimezone(dt.timezone.utc)


def ticks_after(expression: str, zone: zoneinfo.ZoneInfo, after: dt.datetime) -> Iterator[dt.datetime]:
    """The ticks strictly after ``after``, in UTC, in order (the cron expression read in ``zone``)."""
    for tick in load_cron().CronSim(expression, after.astimezone(zone)):
        yield tick.astimezone(dt.timezone.utc)


def due_ticks(expression: str, zone: zoneinfo.ZoneInfo, *, last: dt.datetime, now: dt.datetime, missed: Missed,
              catch_up_limit: int) -> list[dt.datetime]:
    """The ticks to enqueue now, oldest first: of those after ``last`` (the latest handled) up to ``now``, the
    latest only (``skip``), or the latest ``catch_up_limit`` (``catch_up``)."""
    kept: collections.deque[dt.datetime] = collections.deque(maxlen=1 if missed == "skip" else catch_up_limit)
    for tick in ticks_after(expression, zone, last):
        if tick > now:
            break
        kept.append(tick)
    return list(kept)


def next_tick(expression: str, zone: zoneinfo.ZoneInfo, after: dt.datetime) -> dt.datetime:
    return next(ticks_after(expression, zone, after))


def tick_bucket_id(queue: str, name: str, tick: dt.datetime) -> ObjectId:
    """The ``_id`` of the bucket that carries ``tick`` of schedule ``name`` of ``queue``: the same in every
    scheduler, so a second insert is a duplicate key. Its first four bytes are the tick's second (a bucket's
    ``_id`` says when it was made), the other eight a hash of the three."""
    seconds = int(tick.timestamp())
    digest = hashlib.blake2b(f"{queue}\0{name}\0{tick.isoformat()}".encode(), digest_size=8).digest()
    return ObjectId(seconds.to_bytes(4, "big") + digest)


def tick_partition(name: str, partitions: int) -> int:
    """A schedule's buckets all go to one partition, the same in every scheduler: a retried insert must land
    on the same shard key to fail as a duplicate (CRC-32 of the name, as ordered groups do)."""
    return zlib.crc32(name.encode()) % partitions


def tick_key(name: str, tick: dt.datetime) -> str:
    """The message's dedupe key (``k``): with ``dedupe=True`` the consumer's inbox also drops a second copy."""
    return f"{STATE_PREFIX}{name}@{tick.isoformat()}"


def state_id(name: str) -> dict[str, str]:
    return {"_id": STATE_PREFIX + name}


def claim_update(tick: dt.datetime, *, sent: bool = False) -> dict[str, Any]:
    """The state written before a tick's insert: ``sent: false`` tells the next scheduler to insert it again
    (idempotent) if this one stops before its insert is known to be stored. A first run's state starts from a
    tick that is not enqueued: ``sent`` already."""
    return {"$set": {"tick": tick, "sent": sent}}


def sent_update() -> dict[str, Any]:
    """The state once its tick's insert is stored."""
    return {"$set": {"sent": True}}

"""Queue options, validated at construction so a bad value fails early and says which option is wrong."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from bucketq.core.backoff import MAX_DELAY_S
from bucketq.core.backoff import check_delay as check_delay  # where the shells take it from, with the other checks
from bucketq.core.format import MAX_BUCKET_BYTES, MAX_BUCKET_SIZE, SIDE_COLLECTION_SUFFIXES
from bucketq.core.priorities import DEFAULT_FAIRNESS, check_fairness
from bucketq.core.rate_limit import RateLimit
from bucketq.core.sharding import MAX_PARTITIONS, check_partitions
from bucketq.errors import InvalidOption


class _Default(float):
    """An option's default that follows another option (``QueueOptions.__post_init__`` replaces it): a float
    of its own type, so that a user who passes the same number explicitly is told when it is out of bounds."""


FOLLOWS_LEASE = _Default(0.5)  # state_flush_period: 0.5 s, or a third of the lease when that is less
DEFAULT_TOMBSTONE_RETENTION = 600.0
FOLLOWS_WRITE_TIMEOUT = _Default(DEFAULT_TOMBSTONE_RETENTION)  # tombstone_retention: see tombstone_default


@dataclass(frozen=True)
class QueueOptions:
    """Every tunable of a queue. Times are in seconds, sizes in bytes.

    Producer:
        bucket_max_size: messages per bucket before it is written.
        bucket_max_bytes: encoded bytes per bucket before it is written (below MongoDB's 16 MiB limit).
        bucket_max_wait: the longest a bucket stays open after its first message. A bucket is written at
            once when no write of this queue is in flight (group commit: a lone push costs one insert round
            trip), and fills while writes are in flight, until full or this old.
        bucket_min_wait: the shortest a bucket stays open when no write is in flight. 0 writes a lone push at
            once; a few milliseconds make fuller buckets (fewer consumer commands per message) under a
            moderate steady load, at that cost in push latency.
        due_granularity: delayed messages share a bucket only within windows of this many seconds; no
            message becomes due later than its own due time plus this.
        max_buffered_bytes: bytes buffered or being written before ``push`` waits (backpressure).
        max_in_flight_writes: concurrent bucket writes.
        write_timeout: seconds a bucket write may keep retrying before its pushes fail.
        write_concern: ``w`` value: an int from 1 to 50, "majority" or a tag set name; None keeps the
            client's default. Unacknowledged writes (``w=0``) are refused: a push could not know it was stored.
    Consumer:
        lease: seconds a claimed bucket stays reserved without being extended.
        state_flush_period: seconds between flushes of ack/nack state (also extends leases), at most a third of
            the lease. Unset, it follows the lease: 0.5, or a third of the lease when that is less.
        finish_linger: the longest a bucket's finish (its replacement by a tombstone, once every message is
            resolved) waits for other buckets' finishes while the queue has a backlog, to go with them in one
            bulk write; capped at ``state_flush_period``. 0 writes each finish at once. A consumer that dies
            meanwhile gives back the bucket's acks since its last flush (they are delivered again).
        max_attempts: deliveries of a message before it goes to the dead-letter collection.
        retry_base: the first retry's delay in seconds. A message nacked after ``tries`` deliveries waits
            ``min(retry_max, retry_base * retry_factor**tries)`` scaled by ``1 ± retry_jitter`` (the backoff).
        retry_factor: what the retry delay is multiplied by at each further try.
        retry_max: the longest retry delay, in seconds.
        retry_jitter: the random spread of each retry delay, a fraction in [0, 1).
        malformed: "quarantine" moves a bucket with any undecodable message to quarantine whole;
            "skip" quarantines only the bad messages and serves the rest. Either way, a bucket whose writer
            marked it checked (``pc``: this library's queue producers do, docs/FORMAT.md) is decoded a message
            at a time as served, and one of its messages that fails anyway is quarantined alone.
        quarantine_retention: seconds before quarantine entries are purged; None keeps them forever.
        inbox_retention: seconds before the dedupe keys of acknowledged messages (the inbox collection that
            ``dedupe`` reads) are purged; None keeps them forever.
        dedupe: skip messages whose ``key`` was already acknowledged (keys kept in an inbox collection).
        poll_interval: longest wait between claim attempts when no change stream wakes the consumer.
        change_streams: use change streams for wake-ups; None detects support at run time.
        priority_fairness: claims take the due bucket of the highest ``push(priority=...)`` level first, except
            every ``priority_fairness``-th bucket a consumer takes, which is the oldest due one whatever its level,
            so that lower levels are never starved (docs/guide/priorities.md). 0: strict priorities (lower levels wait
            while higher ones are due); 1: due order only.
        drain_timeout: seconds ``drain()`` waits for in-flight handlers.
        tombstone_retention: seconds a finished bucket's tombstone is kept, so that an insert of it retried
            late (its first reply was lost) cannot store it again; must exceed every producer's write_timeout.
            Unset, it follows ``write_timeout``: 600, or twice ``write_timeout`` when that is more.
        partitions: the routing unit of a sharded queue (docs/SCALING.md), from 1 to 1024: producers spread
            buckets over them (an ordered group keeps to one), consumers claim in one at a time, in turn. Fixed
            when the queue is created (stored in ``<name>.control``). None (the default): the queue's own, 1 for a
            new queue. A count that differs from the queue's raises ``InvalidOption``.
        rate_limit: ``RateLimit(limit, per=seconds)``: at most ``limit`` messages served per window of ``per``
            seconds by every consumer of the queue together, counted in ``<name>.rate``. Stored with the queue
            (``<name>.control``) by the first client that names one; a limit that differs from the stored one
            raises ``InvalidOption``. None (the default): the queue's stored limit, if it has one; else no limit.
    """

    bucket_max_size: int = 1024
    bucket_max_bytes: int = 8 * 1024 * 1024
    bucket_max_wait: float = 0.5
    bucket_min_wait: float = 0.0
    due_granularity: float = 1.0
    max_buffered_bytes: int = 64 * 1024 * 1024
    max_in_flight_writes: int = 2
    write_timeout: float = 30.0
    write_concern: int | str | None = None
    lease: float = 30.0
    state_flush_period: float = FOLLOWS_LEASE
    finish_linger: float = 0.05
    max_attempts: int = 5
    retry_base: float = 1.0
    retry_factor: float = 2.0
    retry_max: float = 300.0
    retry_jitter: float = 0.2
    malformed: Literal["quarantine", "skip"] = "quarantine"
    quarantine_retention: float | None = 14 * 86400.0
    inbox_retention: float | None = 7 * 86400.0
    dedupe: bool = False
    poll_interval: float = 0.1
    change_streams: bool | None = None
    drain_timeout: float = 10.0
    tombstone_retention: float = FOLLOWS_WRITE_TIMEOUT
    partitions: int | None = None
    rate_limit: RateLimit | None = None
    priority_fairness: int = DEFAULT_FAIRNESS

    def __post_init__(self) -> None:
        # Options whose bounds depend on another option's value follow it unless the user set them, so that a
        # lease or write_timeout the user chose never fails on an option the user never set.
        if isinstance(self.lease, (int, float)) and not isinstance(self.lease, bool):
            _derive(self, "state_flush_period", min(FOLLOWS_LEASE, self.lease / 3))
        if isinstance(self.write_timeout, (int, float)) and not isinstance(self.write_timeout, bool):
            _derive(self, "tombstone_retention", tombstone_default(self.write_timeout))
        for f in fields(self):
            value = getattr(self, f.name)
            expected = _TYPES.get(f.name)
            if expected and not _type_ok(value, expected, f.name in _NULLABLE):
                raise InvalidOption(f"{f.name} must be {_describe(expected)}, got {value!r}")
        _check(1 <= self.bucket_max_size <= MAX_BUCKET_SIZE, "bucket_max_size", f"between 1 and {MAX_BUCKET_SIZE}")
        _check(1024 <= self.bucket_max_bytes <= MAX_BUCKET_BYTES, "bucket_max_bytes",
               f"between 1024 and {MAX_BUCKET_BYTES} (MongoDB's 16 MiB limit less room for state)")
        _check(0 <= self.bucket_max_wait <= 60, "bucket_max_wait", "between 0 and 60 seconds")
        _check(0 <= self.bucket_min_wait <= self.bucket_max_wait, "bucket_min_wait",
               f"between 0 and bucket_max_wait ({self.bucket_max_wait:g} s)")
        _check(0.001 <= self.due_granularity <= 3600, "due_granularity", "between 0.001 and 3600 seconds")
        _check(self.max_buffered_bytes >= self.bucket_max_bytes, "max_buffered_bytes",
               f"at least bucket_max_bytes ({self.bucket_max_bytes})")
        _check(1 <= self.max_in_flight_writes <= 64, "max_in_flight_writes", "between 1 and 64")
        _check(0 < self.write_timeout <= MAX_DELAY_S, "write_timeout", f"positive, at most {MAX_DELAY_S:.0f} seconds")
        _check(self.write_concern is None or _acknowledged(self.write_concern), "write_concern",
               f"None (the client's default), an int from 1 to {MAX_W}, 'majority' or a tag set name "
               f"(bucketq needs acknowledged writes), got {self.write_concern!r}")
        _check(1 <= self.lease <= 86400, "lease", "between 1 and 86400 seconds")
        _check(0.01 <= self.state_flush_period <= self.lease / 3, "state_flush_period",
               f"between 0.01 s and a third of the lease ({self.lease / 3:g} s)")
        _check(0 <= self.finish_linger <= 1, "finish_linger", "between 0 and 1 second")
        _check(self.max_attempts >= 1, "max_attempts", "at least 1")
        _check(0 <= self.retry_base <= self.retry_max <= MAX_DELAY_S and self.retry_factor >= 1,
               "retry_base/retry_factor/retry_max",
               f"0 <= retry_base <= retry_max <= {MAX_DELAY_S:.0f} seconds and retry_factor >= 1")
        _check(0 <= self.retry_jitter < 1, "retry_jitter", "in [0, 1)")
        _check(self.malformed in ("quarantine", "skip"), "malformed", "'quarantine' or 'skip'")
        for name in ("quarantine_retention", "inbox_retention"):
            value = getattr(self, name)
            _check(value is None or 0 < value <= MAX_DELAY_S, name,
                   f"None (keep forever) or positive, at most {MAX_DELAY_S:.0f} seconds")
        _check(0.005 <= self.poll_interval <= 60, "poll_interval", "between 0.005 and 60 seconds")
        _check(self.drain_timeout >= 0, "drain_timeout", "zero or more")
        _check(self.write_timeout < self.tombstone_retention <= MAX_DELAY_S, "tombstone_retention",
               f"more than write_timeout ({self.write_timeout:g} s), at most {MAX_DELAY_S:.0f} seconds")
        _check(self.partitions is None or check_partitions(self.partitions), "partitions",
               f"an int from 1 to {MAX_PARTITIONS} (or None: the queue's own, 1 for a new one)")
        check_fairness(self.priority_fairness)


def _derive(options: QueueOptions, name: str, value: float) -> None:
    """Set option ``name`` to ``value`` when it holds its default (``_Default``), which the user did not set."""
    if type(getattr(options, name)) is _Default:
        object.__setattr__(options, name, float(value))


def tombstone_default(write_timeout: float) -> float:
    """``tombstone_retention`` when unset: 600 s, or twice ``write_timeout`` when more (it must exceed it)."""
    return min(MAX_DELAY_S, max(DEFAULT_TOMBSTONE_RETENTION, 2 * write_timeout))


_INT = (int,)
_NUM = (int, float)
_TYPES: dict[str, tuple[type, ...]] = {
    "bucket_max_size": _INT, "bucket_max_bytes": _INT, "max_buffered_bytes": _INT, "max_in_flight_writes": _INT,
    "max_attempts": _INT, "partitions": _INT, "priority_fairness": _INT, "bucket_max_wait": _NUM,
    "bucket_min_wait": _NUM, "due_granularity": _NUM,
    "write_timeout": _NUM, "lease": _NUM,
    "state_flush_period": _NUM, "finish_linger": _NUM, "retry_base": _NUM, "retry_factor": _NUM, "retry_max": _NUM,
    "retry_jitter": _NUM,
    "quarantine_retention": _NUM, "inbox_retention": _NUM, "tombstone_retention": _NUM, "poll_interval": _NUM,
    "drain_timeout": _NUM, "dedupe": (bool,), "change_streams": (bool,), "rate_limit": (RateLimit,),
}
_NULLABLE = {"change_streams", "quarantine_retention", "inbox_retention", "partitions", "rate_limit"}
MAX_W = 50  # members a replica set can have: a larger w is never satisfied


def _type_ok(value: object, expected: tuple[type, ...], nullable: bool) -> bool:
    if value is None:
        return nullable
    if isinstance(value, bool):  # bool is an int subclass; True is no bucket size
        return bool in expected
    return isinstance(value, expected)


def _describe(types: tuple[type, ...]) -> str:
    return " or ".join("a number" if t is float else f"an {t.__name__}" if t is int else f"a {t.__name__}"
                       for t in types)


def _check(ok: bool, name: str, rule: str) -> None:
    if not ok:
        raise InvalidOption(f"{name} must be {rule}")


def _acknowledged(w: object) -> bool:
    """A ``w`` that the server acknowledges: 0 and below (and True, which is 1 only to Python) are not."""
    if isinstance(w, bool):
        return False
    if isinstance(w, int):
        return 1 <= w <= MAX_W
    return isinstance(w, str) and w != "" and _is_utf8(w)


def _is_utf8(text: str) -> bool:
    """False for text with lone surrogates, which cannot be sent to the server."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# The queue options a stream takes too, with the same meaning and checks (``QueueOptions``).
STREAM_QUEUE_OPTIONS = ("bucket_max_size", "bucket_max_bytes", "bucket_max_wait", "bucket_min_wait",
                        "max_buffered_bytes", "max_in_flight_writes", "write_timeout", "write_concern", "lease",
                        "state_flush_period", "poll_interval", "tombstone_retention")


@dataclass(frozen=True)
class StreamOptions:
    """Every tunable of a stream (``bucketq.Stream``). Times are in seconds, sizes in bytes.

    ``queue``: the options a stream shares with a queue (``STREAM_QUEUE_OPTIONS``, as ``QueueOptions`` describes
    them): the producer's, and for readers ``lease`` (how long a group's claim on a bucket lasts without being
    extended: a reader that dies holding one delays its unacked messages this long), ``state_flush_period``
    (between writes of acks, which also extend leases; a bucket's claim is finished at once when its last
    message is acked), ``poll_interval`` (between scans when a reader finds nothing to read) and
    ``tombstone_retention`` (how long retention keeps a gap marker below the floor: see
    ``core.stream_retention.retired``).

    gap_wait: seconds a reader waits for an allocated sequence to land before it marks it a gap for good (a
        producer killed after allocating, or whose write failed). A producer's write landing later is refused
        (its pushes raise ``WriteFailed``). Every group's committed position waits this long behind such a hole.
    retention_age, retention_messages, retention_bytes: housekeeping (every minute, and ``apply_retention()``)
        deletes the oldest buckets once older than ``retention_age``, or past ``retention_messages`` messages or
        ``retention_bytes`` payload bytes counted from the newest. None: no limit. All None (the default): keep
        everything. In a partitioned stream the limits apply to each partition.
    partitions: how many independent sequences the stream has (1 to 1024; docs/FORMAT.md, Partitions), fixed
        when the stream is created. None (the default): the stream's own, 1 for a new stream. A count that
        differs from the stream's raises ``InvalidOption``.
    """

    gap_wait: float = 35.0
    retention_age: float | None = None
    retention_messages: int | None = None
    retention_bytes: int | None = None
    partitions: int | None = None
    queue: QueueOptions = field(default_factory=QueueOptions)

    @classmethod
    def from_keywords(cls, options: Mapping[str, Any]) -> StreamOptions:
        """The options of ``Stream(**options)``; ``InvalidOption`` names an unknown or bad one."""
        own = {k: v for k, v in options.items() if k in cls.__dataclass_fields__ and k != "queue"}
        shared = {k: v for k, v in options.items() if k in STREAM_QUEUE_OPTIONS}
        unknown = set(options) - set(own) - set(shared)
        if unknown:
            raise InvalidOption(f"unknown option(s): {', '.join(sorted(unknown))}")
        return cls(**own, queue=QueueOptions(**shared))

    def __post_init__(self) -> None:
        for name in ("gap_wait", "retention_age"):
            value = getattr(self, name)
            _check(value is None and name != "gap_wait" or _type_ok(value, _NUM, False) and 0 < value <= MAX_DELAY_S,
                   name, f"a positive number of seconds, at most {MAX_DELAY_S:.0f}"
                   + (" (or None: no limit)" if name != "gap_wait" else ""))
        for name in ("retention_messages", "retention_bytes"):
            value = getattr(self, name)
            _check(value is None or _type_ok(value, _INT, False) and value > 0, name,
                   "None (no limit) or a positive int")
        parts = self.partitions
        _check(parts is None or check_partitions(parts), "partitions",
               f"an int from 1 to {MAX_PARTITIONS} (or None: the stream's own, 1 for a new one)")

    @property
    def retains(self) -> bool:
        """Whether any retention limit is set."""
        return any(v is not None for v in (self.retention_age, self.retention_messages, self.retention_bytes))


MAX_NAMESPACE_BYTES = 255  # MongoDB's limit on "<db>.<collection>" (unsharded collections)
MAX_DB_NAME_BYTES = 63
_DB_NAME_BAD_CHARS = frozenset('/\\. "$*<>:|?\0')  # refused by MongoDB on Windows (a superset of Linux's)


def check_names(name: object, db: object) -> None:
    """Refuse, with ``InvalidOption``, a queue name or database name (None: not known yet, checked later)
    that MongoDB would refuse for any of the queue's collections, or that collides with another queue's."""
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"name must be a non-empty string, got {name!r}")
    problem = (
        "it is not valid Unicode text (lone surrogates)" if not _is_utf8(name) else
        "it holds '$' or NUL" if "$" in name or "\0" in name else
        "MongoDB reserves system.* collection names" if name == "system" or name.startswith("system.") else
        "a dot-separated part of it is empty" if "" in name.split(".") else
        f"it is a side collection of queue {name.rsplit('.', 1)[0]!r} (they end in "
        f"{', '.join(SIDE_COLLECTION_SUFFIXES)})" if name.endswith(SIDE_COLLECTION_SUFFIXES) else None)
    if problem:
        raise InvalidOption(f"{name!r} is not a valid queue name: {problem}")
    if db is None:
        return
    if not isinstance(db, str) or not db:
        raise InvalidOption(f"db must be a non-empty string, got {db!r}")
    if not _DB_NAME_BAD_CHARS.isdisjoint(db) or not _is_utf8(db) or len(db.encode()) > MAX_DB_NAME_BYTES:
        raise InvalidOption(f"{db!r} is not a valid database name: at most {MAX_DB_NAME_BYTES} bytes of valid "
                            f"Unicode text without any of {''.join(sorted(_DB_NAME_BAD_CHARS))!r}")
    longest = f"{db}.{name}{max(SIDE_COLLECTION_SUFFIXES, key=len)}"
    if len(longest.encode()) > MAX_NAMESPACE_BYTES:
        raise InvalidOption(f"queue name {name!r} is too long: its collection {longest!r} takes "
                            f"{len(longest.encode())} bytes in UTF-8, MongoDB allows {MAX_NAMESPACE_BYTES}")


def check_database(database: Any, name: str, write_concern: int | str | None) -> None:
    """What only the database handle tells: its name when the URI or the client chose it (it counts in the
    namespace length), and whether the client's write concern, kept when ``write_concern`` is None, is
    acknowledged."""
    check_names(name, database.name)
    if write_concern is None and not database.write_concern.acknowledged:
        raise InvalidOption("the client's write concern is unacknowledged (w=0), and bucketq needs acknowledged "
                            "writes: pass write_concern=1 or 'majority'")


def check_write_concern(w: object) -> None:
    """Refuse a ``w`` the server would not acknowledge (0, -1, True, ""): bucketq needs acknowledged writes."""
    if w is not None and not _acknowledged(w):
        raise InvalidOption(f"write_concern must be None, an int from 1 to {MAX_W}, 'majority' or a tag set "
                            f"name: bucketq needs acknowledged writes, got {w!r}")


def check_timeout(timeout: object) -> float | None:
    """A wait in seconds: None (forever) or a number, not NaN; negative means do not wait."""
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout != timeout:
        raise InvalidOption(f"timeout must be None or a number of seconds, got {timeout!r}")
    return float(timeout)

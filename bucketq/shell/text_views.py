"""The text views that the CLI and the dashboard share: one-line messages, JSON, ages and payload previews; the
dead letters and quarantine entries (which collection, the filters of a requeue or purge, a page of a listing,
an entry as a plain dict); and the server's time that ages are counted from. Neither ``bucketq.cli`` nor
``bucketq.web`` owns them, so that each imports them from here and neither imports the other."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

import orjson
from bson import ObjectId

from bucketq.codecs import codec_named
from bucketq.core.entries import EntryKind, Selection
from bucketq.shell.queue_internals import QueueInternals

MAX_MESSAGE = 300


# -- short forms ----------------------------------------------------------------------------------------------

def one_line(text: str) -> str:
    """The first line of ``text``, cut to ``MAX_MESSAGE`` characters: an error as one line of a log or a page."""
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return first if len(first) <= MAX_MESSAGE else first[:MAX_MESSAGE - 1] + "…"


def to_json(value: Any) -> str:
    """Compact JSON; dates as ISO 8601, ObjectIds as hex, binary as base64."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()


def pretty_json(value: Any) -> str:
    """``to_json`` indented by two spaces, for a page showing one value whole."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2).decode()


def _default(value: Any) -> Any:
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def preview(value: Any, width: int = 80) -> str:
    """``value`` as compact JSON, cut to ``width`` characters."""
    text = to_json(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def age(seconds: float) -> str:
    """``42s``, ``3m 5s``, ``2h 10m``, ``4d 3h``."""
    s = int(max(0.0, seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit} {s % size // sub_size}{sub}"
    return f"{s}s"


def relative(when: dt.datetime | None, now: dt.datetime) -> str:
    """``when`` from ``now``: ``now``, ``in 5m 2s`` or ``3s ago``; ``-`` for None. ``now`` is the server's time
    (``server_now``), as the stored times are."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return "now" if abs(delta) < 1 else f"in {age(delta)}" if delta > 0 else f"{age(-delta)} ago"


def server_now(door: QueueInternals) -> dt.datetime:
    """The server's clock as a queue reads it (``door``: ``bucketq.queue.internals(queue)``): what the ages of its
    messages are counted from. Never this host's wall clock, which a step or a skew would put in every age shown."""
    return door.clock.now()


# -- dead letters and quarantine ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """Dead letters or quarantine entries: their collection, their names and the Queue methods that act on them."""

    command: str  # also the ``EntryKind`` of these entries
    one: str
    many: str
    reason: str  # the field the --error filter searches
    methods: tuple[str, str, str]  # Queue methods: list, requeue, purge
    about: str

    def count(self, n: int) -> str:
        """``1 dead letter``, ``1,024 dead letters``."""
        return f"{n:,} {self.one if n == 1 else self.many}"


DEAD = Kind("dead", "dead letter", "dead letters", "error", ("dead_letters", "requeue_dead", "purge_dead"),
            "Dead letters: messages that failed max_attempts deliveries, kept with their last error.")
QUARANTINE = Kind("quarantine", "quarantined entry", "quarantined entries", "reason",
                  ("quarantined", "requeue_quarantined", "purge_quarantined"),
                  "Quarantine: buckets or messages that could not be decoded, kept with the reason.")


def _selection(door: QueueInternals, older_than: float | None, error_contains: str | None,
               ids: list[Any] | None) -> Selection:
    return Selection(door.clock.latest(), older_than, error_contains, ids)


async def count_matching(door: QueueInternals, kind: Kind, *, older_than: float | None = None,
                         error_contains: str | None = None, ids: list[Any] | None = None) -> int:
    """How many of a queue's entries of ``kind`` match the filters a requeue or purge is given (``door``:
    ``bucketq.queue.internals(queue)``)."""
    return await door.store.count_entries(EntryKind(kind.command), _selection(door, older_than, error_contains, ids))


async def entries_page(door: QueueInternals, kind: Kind, *, skip: int, limit: int,
                       error_contains: str | None = None, ids: list[Any] | None = None) -> list[dict[str, Any]]:
    """The entries of ``kind`` matching the filters, oldest first, from the ``skip``-th on: a page of a listing."""
    return await door.store.entries(EntryKind(kind.command), _selection(door, None, error_contains, ids),
                                    limit=limit, skip=skip)


def entry_ids(ids: tuple[str, ...]) -> list[Any] | None:
    """Dead-letter ids are strings; a quarantined bucket's id is an ObjectId: match a hex id either way."""
    if not ids:
        return None
    return [v for i in ids for v in ([ObjectId(i), i] if ObjectId.is_valid(i) else [i])]


def entry_view(entry: dict[str, Any]) -> dict[str, Any]:
    """A dead letter (``error``) or quarantine entry (``reason``, ``kind``) with its payload decoded, and its
    ``priority`` when its message had a level above 0 (which a requeue keeps)."""
    view: dict[str, Any] = {"id": entry["_id"]}
    for field in ("kind", "at", "tries", "error", "reason", "enqueued_at"):
        if field in entry:
            view[field] = entry[field]
    for field, name in (("h", "headers"), ("k", "key"), ("pr", "priority")):
        if entry.get(field) is not None:
            view[name] = entry[field]
    if entry.get("kind") == "bucket":
        doc = entry.get("doc") or {}
        view["messages"] = len(doc.get("p") or [])
    elif "p" in entry:
        try:
            view["payload"] = codec_named(entry.get("enc", "json")).load(entry["p"])
        except Exception as exc:
            view["undecodable"] = f"{type(exc).__name__}: {exc}"
    return view

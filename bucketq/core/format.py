"""Storage format version 1 (docs/FORMAT.md): field names, document builders and the validator.

Everything another reader (Spark, another language) relies on is defined here once.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import bson
from bson import ObjectId
from bson.raw_bson import RawBSONDocument

from bucketq.core.priorities import MAX_PRIORITY, PRIORITY, is_priority
from bucketq.errors import EncodeError, InvalidOption, MalformedBucket

FORMAT_VERSION = 1
# Group buckets (``push(group=...)``) carry version 2: a version-1 reader would serve them out of order, so it must
# quarantine them instead (docs/FORMAT.md, Versioning). Ungrouped buckets stay version 1.
GROUP_FORMAT_VERSION = 2
MAX_GROUP_BYTES = 1000
# The codec whose payloads are BSON documents (``bucketq.codecs.BsonCodec``); every other codec's are strings or
# binary (docs/FORMAT.md, Payloads).
DOCUMENT_CODEC = "bson"
# ``pc: true``: the writer checked that every payload decodes with the codec ``enc`` names (bucketq's producers with
# its own codecs, whose ``dump`` refuses what ``load`` would not give back, and the retries of such buckets). A
# consumer then decodes each payload when it serves it, not the whole bucket when it claims it (docs/FORMAT.md,
# Payloads checked by the writer).
CHECKED = "pc"
MAX_BUCKET_SIZE = 65536
BSON_LIMIT = 16 * 1024 * 1024
# Room kept free below the BSON limit for what consumers add later: `done` (at most ~14 bytes a slot),
# `lease`, and the per-slot arrays of retry buckets.
STATE_HEADROOM = 16 * MAX_BUCKET_SIZE + 4096
MAX_BUCKET_BYTES = BSON_LIMIT - STATE_HEADROOM
# Fixed bytes of a bucket document besides its payloads: _id, v, enc, due, created, n, c, done, lease.
BUCKET_OVERHEAD = 256
# Bound of ``c`` and of ``t`` entries: far above any real count, far below int64 overflow (``$inc`` on a
# real MongoDB fails there; the test server wraps around).
MAX_COUNT = 2**31 - 1
# Bytes a slot adds to the per-slot arrays of a copied message (retry and requeued buckets): `t` (int),
# `o` (string: the id, at most 24 hex digits, ":", 5 digits, plus framing) and `e` (date), with their keys.
COPY_FIELDS_BYTES = 11 + 48 + 15

UTC = dt.timezone.utc

# Queue ``Q``'s side collections are ``Q.dead``, ``Q.quarantine``, ``Q.inbox``, ``Q.control``, ``Q.groups``,
# ``Q.unique`` and ``Q.rate`` (docs/FORMAT.md, Collections): named here once, so that the store, the batch shell and
# the CLI name them alike and the name check refuses a queue named like another queue's side collection.
DEAD_SUFFIX, QUARANTINE_SUFFIX, INBOX_SUFFIX, CONTROL_SUFFIX = ".dead", ".quarantine", ".inbox", ".control"
GROUPS_SUFFIX, UNIQUE_SUFFIX, RATE_SUFFIX = ".groups", ".unique", ".rate"
QUEUE_SUFFIXES = (DEAD_SUFFIX, QUARANTINE_SUFFIX, INBOX_SUFFIX, CONTROL_SUFFIX, GROUPS_SUFFIX, UNIQUE_SUFFIX,
                  RATE_SUFFIX)
# Stream ``S``'s side collections (docs/FORMAT.md, Streams): its reader groups' positions, their claims, its counter.
POSITIONS_SUFFIX, CLAIMS_SUFFIX, SEQ_SUFFIX = ".positions", ".claims", ".seq"
STREAM_SUFFIXES = (POSITIONS_SUFFIX, CLAIMS_SUFFIX, SEQ_SUFFIX)
# Queue and stream names share one namespace: neither may be named like the other's side collection.
SIDE_COLLECTION_SUFFIXES = QUEUE_SUFFIXES + STREAM_SUFFIXES


class Slot(NamedTuple):
    """One message as written into a bucket: the encoded payload plus optional per-message fields.
    (A NamedTuple: one is made per push, and it is the cheapest immutable record to build.) A producer's
    headers are a ``RawBSONDocument`` encoded at push time, so changing the caller's dict later changes
    nothing stored."""

    payload: str | bytes | Mapping[str, Any]  # a document: the ``bson`` codec's (a ``RawBSONDocument`` when pushed)
    headers: Mapping[str, Any] | None = None
    key: str | None = None
    tries: int = 0
    origin: str | None = None
    enqueued_at: dt.datetime | None = None
    unique: dt.datetime | None = None  # ``push(unique_for=...)``: the message holds its key in ``Q.unique`` until then


# The fields of a Slot after ``key`` at their defaults: ``encode_slot`` builds its Slot with ``tuple.__new__``,
# a third of the time the NamedTuple's Python-level ``__new__`` takes (one Slot is made per push).
_SLOT_DEFAULTS_AFTER_KEY = tuple(Slot._field_defaults[name] for name in Slot._fields[Slot._fields.index("key") + 1:])
# A plain message (no headers, no key, the rest at their defaults) of text or binary: its slot in a producer's open
# bucket is its stored payload itself, no tuple a push (nor one for the garbage collector to walk), and
# ``slot_bytes`` adds PLAIN_SLOT_BYTES to it (the common push builds both inline). ``bucket_document`` tells the
# two kinds of slot apart by type.
PlainSlot = str | bytes
PLAIN_SLOT_TYPES = frozenset({str, bytes})
PLAIN_SLOT_BYTES = 24
AnySlot = Slot | PlainSlot  # what a producer's open bucket holds
# A plain slot's Slot fields after its payload, for a bucket that mixes both kinds
_PLAIN_SLOT_TAIL = (None, None, *_SLOT_DEFAULTS_AFTER_KEY)


def payload_size(payload: str | bytes | Mapping[str, Any]) -> int:
    """A stored payload's bytes: UTF-8 text, binary, or a document's BSON (with its length and terminator)."""
    if isinstance(payload, str):
        return len(payload) if payload.isascii() else len(payload.encode())
    if isinstance(payload, bytes):
        return len(payload)
    return len(payload.raw) if isinstance(payload, RawBSONDocument) else len(bson.encode(payload))


def stored_payload_ok(payload: Any, codec: str) -> TypeGuard[str | bytes | Mapping[str, Any]]:
    """Whether ``payload`` is a ``p`` entry of a bucket of ``codec``: a document for ``DOCUMENT_CODEC``'s, else a
    string or binary."""
    if codec == DOCUMENT_CODEC:
        return isinstance(payload, Mapping)
    return isinstance(payload, (str, bytes))


def slot_bytes(payload: str | bytes | Mapping[str, Any], headers_size: int = 0, key: str | None = None) -> int:
    """An upper bound of the BSON bytes one slot adds to a bucket (array keys are at most 5 digits)."""
    size = payload_size(payload)
    # type byte, key "65535\0", length, terminator / binary subtype (16), and room for the slot's null in `h`/`k`
    # when only some slots have them (8)
    total = size + PLAIN_SLOT_BYTES
    if headers_size:
        total += headers_size + 8
    if key is not None:
        total += len(key.encode()) + 12
    return total


def encode_slot(codec: Any, payload: Any, headers: Mapping[str, Any] | None,
                key: str | None) -> tuple[Slot, int]:
    """The message as a bucket stores it, and its size (``slot_bytes``). Raises ``EncodeError`` for what cannot be
    stored, ``InvalidOption`` for headers that are no mapping or a key that is no string. Headers are encoded now:
    what the caller does with its dict afterwards changes nothing stored."""
    try:
        stored = codec.dump(payload)
    except Exception as exc:
        raise EncodeError(f"cannot encode {type(payload).__name__} payload with the {codec.name} codec: {exc}") \
            from exc
    snapshot = None
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise InvalidOption(f"headers must be a mapping, got {type(headers).__name__}")
        if headers:
            try:
                snapshot = RawBSONDocument(bson.encode(headers))
            except Exception as exc:
                raise EncodeError(f"headers cannot be stored as BSON: {exc}") from exc
    if key is not None:
        if not isinstance(key, str):
            raise InvalidOption(f"key must be a string, got {type(key).__name__}")
        if not key.isascii():
            try:
                key.encode()
            except UnicodeEncodeError as exc:
                raise EncodeError(f"key is not valid UTF-8 text: {exc}") from None
    slot = tuple.__new__(Slot, (stored, snapshot, key, *_SLOT_DEFAULTS_AFTER_KEY))
    return slot, slot_bytes(stored, len(snapshot.raw) if snapshot is not None else 0, key)


def check_group(group: Any) -> str:
    """``group`` as a bucket stores it; ``InvalidOption`` for anything but non-empty UTF-8 text of at most
    ``MAX_GROUP_BYTES`` bytes."""
    if not isinstance(group, str) or not group:
        raise InvalidOption(f"group must be a non-empty string, got {group!r:.60}")
    try:
        size = len(group.encode())
    except UnicodeEncodeError as exc:
        raise InvalidOption(f"group is not valid UTF-8 text: {exc}") from None
    if size > MAX_GROUP_BYTES:
        raise InvalidOption(f"group takes {size} bytes; at most {MAX_GROUP_BYTES}")
    return group


def copy_bytes(slot: Slot) -> int:
    """An upper bound of the BSON bytes a copied slot (with ``t``, ``o``, ``e``) adds to a bucket."""
    headers = len(bson.encode(slot.headers)) if slot.headers else 0
    origin = len(slot.origin.encode()) if slot.origin and len(slot.origin) > 30 else 0  # user-made ids
    return slot_bytes(slot.payload, headers, slot.key) + COPY_FIELDS_BYTES + origin


def bucket_documents(slots: Sequence[Slot], *, codec: str, created: dt.datetime, due: dt.datetime,
                     max_size: int = MAX_BUCKET_SIZE, max_bytes: int = MAX_BUCKET_BYTES,
                     group: str | None = None, partition: int | None = None,
                     priority: int = 0, checked: bool = False) -> list[dict[str, Any]]:
    """New buckets holding ``slots`` in order, as many as it takes to keep each within ``max_size`` slots
    and ``max_bytes`` bytes: copies (retries, requeues) can add up to more than one bucket holds. Buckets of a
    ``group`` get their place in it (``s``) when written, in list order (``Store.number_groups``). Without a
    ``partition`` they get one before they are written (``sharding.assign_by_id``)."""
    return [bucket_document(ObjectId(), chunk, codec=codec, created=created, due=due, group=group,
                            partition=partition, priority=priority, checked=checked)
            for chunk in _chunks(slots, max_size, max_bytes)]


def _chunks(slots: Sequence[Slot], max_size: int, max_bytes: int) -> Iterator[list[Slot]]:
    chunk: list[Slot] = []
    size = BUCKET_OVERHEAD
    for slot in slots:
        extra = copy_bytes(slot)
        if chunk and (len(chunk) >= max_size or size + extra > max_bytes):
            yield chunk
            chunk, size = [], BUCKET_OVERHEAD
        chunk.append(slot)
        size += extra
    if chunk:
        yield chunk


def message_id(bucket_id: ObjectId, slot: int) -> str:
    """The id of a message first stored at ``slot`` of ``bucket_id``; kept when it moves to a retry bucket."""
    return f"{bucket_id}:{slot}"


def bucket_document(
    bucket_id: ObjectId,
    slots: Sequence[AnySlot],
    *,
    codec: str,
    created: dt.datetime,
    due: dt.datetime,
    group: str | None = None,
    partition: int | None = None,
    priority: int = 0,
    checked: bool = False,
) -> dict[str, Any]:
    """A new bucket document (``partition``: its ``pt``, else the store's choice when it writes it). Optional
    per-slot arrays are written only when some slot has the field; a group bucket always has ``t``, so that a nack
    can add a try to one slot, and gets ``s`` when it is written. ``priority`` is written as ``pr`` only above 0:
    a bucket of the default level is the same document as before priorities. ``checked``: the caller vouches that
    every payload decodes with ``codec`` (written as ``pc: true``, see ``CHECKED``)."""
    n = len(slots)
    column: dict[str, tuple[Any, ...]] | None = None
    if set(map(type, slots)) <= PLAIN_SLOT_TYPES:  # plain messages only (the common bucket): no per-slot array
        payloads = list(slots)
    else:
        # The slots' fields as columns, transposed in C: each optional array is then tested by a C loop instead of
        # a generator (a producer builds one bucket of up to 65,536 slots per write).
        full = [(slot, *_PLAIN_SLOT_TAIL) if type(slot) in PLAIN_SLOT_TYPES else slot for slot in slots]
        column = dict(zip(Slot._fields, zip(*full, strict=True), strict=True))
        payloads = list(column["payload"])
    doc: dict[str, Any] = {
        "_id": bucket_id,
        "v": FORMAT_VERSION,
        "enc": codec,
        "created": created,
        "due": due,
        "n": n,
        "p": payloads,
        "done": [],
        "c": 0,
        "lease": None,
    }
    if column is None:
        if group is not None:
            doc["t"] = [0] * n
    else:
        _add_slot_arrays(doc, column, n, created, group)
    if group is not None:
        doc["v"], doc["g"] = GROUP_FORMAT_VERSION, group
    if partition is not None:
        doc["pt"] = partition
    if priority:
        doc[PRIORITY] = priority
    if checked:
        doc[CHECKED] = True
    return doc


def _add_slot_arrays(doc: dict[str, Any], column: dict[str, tuple[Any, ...]], n: int, created: dt.datetime,
                     group: str | None) -> None:
    """A bucket's optional per-slot arrays (docs/FORMAT.md), each written when some slot has its field."""
    if any(column["headers"]):
        doc["h"] = [h or None for h in column["headers"]]
    if column["key"].count(None) != n:
        doc["k"] = list(column["key"])
    if group is not None or any(column["tries"]):
        doc["t"] = list(column["tries"])
    if column["origin"].count(None) != n:
        doc["o"] = list(column["origin"])
    if column["enqueued_at"].count(None) != n:
        doc["e"] = [e or created for e in column["enqueued_at"]]
    if column["unique"].count(None) != n:
        doc["u"] = list(column["unique"])


@dataclass(frozen=True)
class StoredBucket:
    """A validated bucket document, as a consumer sees it after claiming it."""

    id: ObjectId
    codec: str
    created: dt.datetime
    payloads: list[str | bytes | Mapping[str, Any]]
    headers: list[dict[str, Any] | None]
    keys: list[str | None]
    base_tries: list[int]
    origins: list[str | None]
    enqueued: list[dt.datetime | None]
    done: frozenset[int]
    claims: int
    group: str | None = None
    order: int = 0  # ``s``: the bucket's place in its group
    partition: int | None = 0  # ``pt``; None: written without one (partition 0, ``sharding.in_partition``)
    unique: list[dt.datetime | None] | None = None  # ``u``: the slots that hold their key in ``Q.unique``, if any
    priority: int = 0  # ``pr``: its level, which its copies keep
    cancels: frozenset[int] = frozenset()  # ``x``: slots whose cancellation was requested (``core.cancel``)
    checked: bool = False  # ``pc``: its writer checked that every payload decodes (``CHECKED``)

    @property
    def ref(self) -> dict[str, Any]:
        """The bucket's shard key (``pt``, ``_id``): the start of every filter that targets it."""
        return {"pt": self.partition, "_id": self.id}

    @property
    def size(self) -> int:
        return len(self.payloads)

    @functools.cached_property
    def _id_prefix(self) -> str:
        return f"{self.id}:"  # str(ObjectId) costs microseconds: once per bucket, not once per message

    def message_id(self, slot: int) -> str:
        return self.origins[slot] or f"{self._id_prefix}{slot}"

    def enqueued_at(self, slot: int) -> dt.datetime:
        return self.enqueued[slot] or self.created

    def slot(self, index: int, tries: int) -> Slot:
        """The slot as it should be copied into another bucket (retry) or a dead letter."""
        return Slot(
            payload=self.payloads[index],
            headers=self.headers[index],
            key=self.keys[index],
            tries=tries,
            origin=self.message_id(index),
            enqueued_at=self.enqueued_at(index),
            unique=self.unique[index] if self.unique else None,  # the copy holds the key on, under the same id
        )


def as_utc(value: dt.datetime) -> dt.datetime:
    """BSON dates come back naive (UTC) from clients without ``tz_aware``; make them aware."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_bucket(doc: Mapping[str, Any]) -> StoredBucket:
    """Validate a stored document against format version 1; raise ``MalformedBucket`` saying what is wrong."""
    version, group = doc.get("v"), doc.get("g")
    if version not in (FORMAT_VERSION, GROUP_FORMAT_VERSION) or isinstance(version, bool):
        raise MalformedBucket(f"format version {version!r} is not {FORMAT_VERSION} or {GROUP_FORMAT_VERSION}")
    if (version == GROUP_FORMAT_VERSION) != (group is not None):
        raise MalformedBucket(f"a group bucket (field g) has version {GROUP_FORMAT_VERSION}, others {FORMAT_VERSION}")
    if group is not None and (not isinstance(group, str) or not group or not isinstance(doc.get("t"), list)
                              or not isinstance(doc.get("s"), int) or isinstance(doc.get("s"), bool)):
        raise MalformedBucket("g must be a non-empty string, and a group bucket has t and an integer s")
    bucket_id = doc.get("_id")
    if not isinstance(bucket_id, ObjectId):
        raise MalformedBucket(f"_id must be an ObjectId, got {type(bucket_id).__name__}")
    codec = doc.get("enc")
    if not isinstance(codec, str):
        raise MalformedBucket("enc must be a string naming the codec")
    created = doc.get("created")
    if not isinstance(created, dt.datetime):
        raise MalformedBucket("created must be a date")
    payloads = doc.get("p")
    if not isinstance(payloads, list) or not payloads:
        raise MalformedBucket("p must be a non-empty array of payloads")
    n = len(payloads)
    if doc.get("n") != n:
        raise MalformedBucket(f"n is {doc.get('n')!r} but p holds {n} payloads")
    if codec == DOCUMENT_CODEC:
        if not all(map(isinstance, payloads, itertools.repeat(Mapping))):  # in C: a check a message
            raise MalformedBucket(f"every payload in p must be a document (codec {DOCUMENT_CODEC})")
    elif not all(map(isinstance, payloads, itertools.repeat((str, bytes)))):
        raise MalformedBucket("every payload in p must be a string or binary")
    claims = doc.get("c")
    if not _count(claims):
        raise MalformedBucket(f"c must be an integer from 0 to {MAX_COUNT}")
    done = doc.get("done")
    if not _slot_indexes(done, n):
        raise MalformedBucket("done must be an array of slot indexes")
    cancels = doc.get("x", [])
    if not _slot_indexes(cancels, n):
        raise MalformedBucket("x must be an array of slot indexes")
    partition = doc.get("pt")
    if partition is not None and not _count(partition):
        raise MalformedBucket("pt must be an integer from 0 (the bucket's partition)")
    priority = doc.get(PRIORITY, 0)
    if not is_priority(priority):
        raise MalformedBucket(f"pr must be an integer from 0 to {MAX_PRIORITY} (the bucket's priority)")
    if priority and group is not None:
        raise MalformedBucket("a group bucket (field g) has no priority (field pr)")
    checked = doc.get(CHECKED, False)
    if type(checked) is not bool:
        raise MalformedBucket(f"{CHECKED} must be a bool (whether the writer checked every payload decodes)")
    return StoredBucket(
        id=bucket_id,
        codec=codec,
        created=as_utc(created),
        payloads=payloads,
        headers=_optional_array(doc, "h", n, dict),
        keys=_optional_array(doc, "k", n, str),
        base_tries=_tries(doc, n),
        origins=_optional_array(doc, "o", n, str),
        enqueued=[as_utc(e) if e else None for e in _optional_array(doc, "e", n, dt.datetime)],
        done=frozenset(done),
        claims=claims,
        group=group,
        order=doc.get("s", 0),
        partition=partition,
        unique=_optional_array(doc, "u", n, dt.datetime) if "u" in doc else None,
        priority=priority,
        cancels=frozenset(cancels),
        checked=checked,
    )


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _tries(doc: Mapping[str, Any], n: int) -> list[int]:
    if doc.get("t") is None:  # new buckets: no slot was tried before
        return [0] * n
    tries = [t or 0 for t in _optional_array(doc, "t", n, int)]
    if not all(_count(t) for t in tries):
        raise MalformedBucket(f"every entry of t must be an integer from 0 to {MAX_COUNT}")
    return tries


def _slot_indexes(value: Any, n: int) -> TypeGuard[list[int]]:
    """Whether ``value`` is an array of slot indexes of a bucket of ``n`` slots (``done``, ``x``)."""
    return isinstance(value, list) and all(isinstance(i, int) and 0 <= i < n for i in value)


def _optional_array(doc: Mapping[str, Any], field: str, n: int, kind: type) -> list[Any]:
    values = doc.get(field)
    if values is None:
        return [None] * n
    if not isinstance(values, list) or len(values) != n:
        raise MalformedBucket(f"{field} must be an array of {n} entries")
    if not all(v is None or isinstance(v, kind) for v in values):
        raise MalformedBucket(f"every entry of {field} must be a {kind.__name__} or null")
    return values


def dead_letter(bucket: StoredBucket, slot: int, *, tries: int, error: str, at: dt.datetime,
                cancelled: bool = False) -> dict[str, Any]:
    """A dead-letter document; its ``_id`` is the message id, so writing it twice stores it once. It fits 16 MiB
    (``within_limit``). ``cancelled``: the record of a cancelled message (``core.cancel``)."""
    letter: dict[str, Any] = {
        "_id": bucket.message_id(slot),
        "enc": bucket.codec,
        "p": bucket.payloads[slot],
        "h": bucket.headers[slot],
        "k": bucket.keys[slot],
        "tries": tries,
        "error": error[:MAX_REASON_CHARS],
        "at": at,
        "enqueued_at": bucket.enqueued_at(slot),
        "origin": {"bucket": bucket.id, "slot": slot},
        "pt": bucket.partition,  # for information: a requeue spreads its messages anew
    }
    if bucket.group is not None:
        letter["g"] = bucket.group  # a requeue puts it back at the end of its group
    if bucket.priority:
        letter[PRIORITY] = bucket.priority  # a requeue keeps its level
    if cancelled:
        letter["cancelled"] = True
    return within_limit(letter, "error")


# A reason (an exception's text) is kept to this many characters: room for it is part of STATE_HEADROOM.
MAX_REASON_CHARS = 4000
MIN_REASON_BYTES = 256  # what ``within_limit`` keeps of a reason, to leave fields out of a quarantined copy instead


def quarantined_bucket(doc: Mapping[str, Any], *, reason: str, at: dt.datetime, host: str, pid: int) -> dict[str, Any]:
    """A quarantine entry for a whole bucket: the original document kept as it was, without its lease."""
    kept = {k: v for k, v in doc.items() if k != "lease"}
    return within_limit({"_id": doc.get("_id", ObjectId()), "kind": "bucket", "reason": reason[:MAX_REASON_CHARS],
                         "doc": kept, "pt": doc.get("pt"), "at": at, "host": host, "pid": pid}, "reason")


def quarantined_message(bucket: StoredBucket, slot: int, *, reason: str, at: dt.datetime, host: str,
                        pid: int) -> dict[str, Any]:
    """A quarantine entry for one message of an otherwise good bucket (``malformed="skip"``)."""
    entry: dict[str, Any] = {"_id": bucket.message_id(slot), "kind": "message", "reason": reason[:MAX_REASON_CHARS],
                             "enc": bucket.codec, "p": bucket.payloads[slot], "h": bucket.headers[slot],
                             "k": bucket.keys[slot], "origin": {"bucket": bucket.id, "slot": slot},
                             "pt": bucket.partition, "at": at, "host": host, "pid": pid}
    if bucket.priority:
        entry[PRIORITY] = bucket.priority  # a requeue keeps its level
    return within_limit(entry, "reason")


def within_limit(entry: dict[str, Any], text: str) -> dict[str, Any]:
    """``entry`` (a dead letter or quarantine entry) cut to fit MongoDB's 16 MiB document limit. Only a copy of a
    bucket that someone else wrote near that limit can exceed it (a producer's buckets leave room): its ``text``
    field (the reason) is cut first, to no less than ``MIN_REASON_BYTES``; then the largest fields of a whole
    bucket's ``doc`` are left out, largest first, each named in ``omitted`` with its size in bytes, so that the
    entry says what it lost."""
    size = _bson_size(entry)
    if size <= BSON_LIMIT:
        return entry
    encoded = entry[text].encode()
    keep = max(MIN_REASON_BYTES, len(encoded) - (size - BSON_LIMIT))
    entry[text] = encoded[:keep].decode(errors="ignore")
    doc = entry.get("doc")
    if isinstance(doc, dict):
        sizes = sorted(((_bson_size({k: v}), k) for k, v in doc.items() if k != "_id"), reverse=True)
        omitted: dict[str, int] = {}
        while sizes and _bson_size(entry) > BSON_LIMIT:
            field_size, key = sizes.pop(0)
            del doc[key]
            omitted[key] = field_size
            entry["omitted"] = omitted
    return entry


def _bson_size(doc: Mapping[str, Any]) -> int:
    return len(bson.encode(doc))

"""Payload codecs: how a payload becomes the bytes, text or document stored in a bucket's ``p`` array.

A codec is any object with ``name``, ``dump(payload)`` and ``load(stored)``. ``dump`` returns ``str``
(stored as a BSON string) or ``bytes`` (stored as BSON binary); only the built-in ``bson`` codec stores
documents (``p`` entries of BSON type object, docs/FORMAT.md). The codec name is written into each bucket
(``enc``) so readers in other languages know how to decode it.

A codec whose ``dump`` refuses what its ``load`` would not give back may say so with ``checks_on_dump = True``, as
the built-in ones do: a queue's buckets of its payloads are then marked as checked (``pc``), and consumers decode
each payload as they serve it instead of the whole bucket when they claim it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import bson
import orjson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

from bucketq.core.format import DOCUMENT_CODEC
from bucketq.errors import InvalidOption, MalformedBucket


@runtime_checkable
class Codec(Protocol):
    """What a payload codec of your own provides: pass one as ``Queue(..., codec=...)``. Its ``name`` is stored in
    each bucket (``enc``), so every consumer of the queue needs a codec of that name."""

    name: str

    def dump(self, payload: Any) -> str | bytes:
        """The payload as stored; raise (any exception) to refuse it: its push fails with ``EncodeError``."""
        ...

    def load(self, stored: Any) -> Any:
        """The payload back from what ``dump`` stored; an exception sends the message to quarantine."""
        ...


class CodecUnavailable(MalformedBucket):
    """No codec of that name here: unknown, or its extra is not installed. A consumer quarantines a bucket
    that names one (a ``MalformedBucket``); a queue built with one raises ``InvalidOption``."""


class JsonCodec:
    """JSON through orjson, stored as UTF-8 text. The default: fastest to encode and Spark reads it with
    ``from_json``. Takes only what it gives back: dicts with str keys, lists, tuples (given back as lists),
    str, int, float, bool and None, subclasses included (given back as the base type). orjson would write
    datetimes, UUIDs, enums and dataclasses as strings or dicts, and NaN/Infinity as null: those are refused."""

    name = "json"
    checks_on_dump = True

    def dump(self, payload: Any) -> str:
        """The payload as JSON text; raises for what would not come back equal (see the class)."""
        encoded = orjson.dumps(payload, option=_JSON_OPTIONS)
        # UUIDs and enums cannot be kept from orjson; they, NaN (as null) and tuples (as lists) decode to
        # something unequal. A small flat dict of plain values (most events) is told apart at a glance, here
        # rather than in a function of its own (a call a push); else the decode and compare run in C, and only
        # then is the payload walked, to tell. Plain: exactly a str, int, bool, None or finite float (orjson
        # already refused non-str keys and ints beyond 64 bits).
        if type(payload) is dict and len(payload) <= 16:
            for value in payload.values():
                kind = type(value)
                if kind not in _PLAIN and (kind is not float or value - value != 0.0):
                    break
            else:
                return encoded.decode()
        if orjson.loads(encoded) != payload:
            _check_json_native(payload)
        return encoded.decode()

    # orjson's own function, not a method around it: a consumer calls it once a message
    load = staticmethod(orjson.loads)


class MsgpackCodec:
    """MessagePack, stored as BSON binary. Needs the ``msgpack`` extra. Refuses what it could not decode
    (tuple dict keys come back as lists, which cannot be keys), so that only that push fails."""

    name = "msgpack"
    checks_on_dump = True

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError:
            raise CodecUnavailable("the msgpack codec needs the msgpack extra: pip install 'bucketq[msgpack]'") \
                from None
        self._msgpack = msgpack

    def dump(self, payload: Any) -> bytes:
        """The payload as msgpack bytes; raises for what would not decode back."""
        packed = self._msgpack.packb(payload, use_bin_type=True)
        try:
            self.load(packed)  # what every consumer will do
        except Exception as exc:
            raise ValueError(f"it would not decode ({exc}): a tuple dict key, for one, comes back as a list") \
                from exc
        return packed

    def load(self, stored: str | bytes) -> Any:
        """The payload from its msgpack bytes."""
        return self._msgpack.unpackb(stored, raw=False, strict_map_key=False)


class BsonCodec:
    """Payloads stored as native BSON subdocuments of ``p``: the Spark connector maps their fields straight to
    columns (``bucketq_spark.reader``, no JSON parse), and other readers get documents. Payloads must be
    documents (mappings with str keys) of what BSON stores; anything else fails its push. They come back as
    BSON gives them: tuples as lists, datetimes in UTC to the millisecond, subclasses as their base type,
    ``bytes`` as ``bytes``; a consumer gets its own copy, so changing it changes nothing a retry stores."""

    name = DOCUMENT_CODEC
    checks_on_dump = True

    def dump(self, payload: Any) -> RawBSONDocument:
        """The payload, a document, encoded as BSON now; raises ``TypeError`` for anything but a mapping."""
        if not isinstance(payload, Mapping):
            raise TypeError(f"the {self.name} codec stores documents (a dict), not {type(payload).__name__}")
        # encoded once, now: the size check uses its bytes, and a later change to the caller's dict stores nothing
        return RawBSONDocument(bson.encode(payload))

    def load(self, stored: Any) -> Any:
        """The payload as a fresh dict, as BSON gives it back (see the class)."""
        if not isinstance(stored, Mapping):
            raise TypeError(f"a {self.name} payload is a document, got {type(stored).__name__}")
        return bson.decode(bson.encode(stored), codec_options=_AS_READ)


# How the store reads documents (``bucketq.store.aio.base.collections``): a consumer's payload decodes alike.
_AS_READ: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True, tzinfo=dt.timezone.utc,
                                                      datetime_conversion=DatetimeConversion.DATETIME_AUTO)


# Datetimes and dataclasses are refused (there is no ``default``) instead of becoming strings and dicts.
_JSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


_PLAIN = frozenset({str, int, bool, type(None)})


def _check_json_native(value: Any) -> None:
    """Raise unless ``value`` holds only what JSON gives back (dict keys: orjson already refused non-str ones).
    ``x - x`` is NaN exactly for NaN and ±inf, which orjson writes as null."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if item - item != 0.0:
                raise ValueError(f"{item!r} is not valid JSON")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not isinstance(item, (str, int)) and item is not None:  # an enum, a UUID: not given back
            raise TypeError(f"{type(item).__name__} is not a JSON type: it would come back as something else")


CODECS: dict[str, type] = {"json": JsonCodec, "msgpack": MsgpackCodec, DOCUMENT_CODEC: BsonCodec}


def codec_named(name: str) -> Codec:
    """A built-in codec; ``CodecUnavailable`` when there is none of that name or its extra is missing."""
    try:
        return CODECS[name]()
    except KeyError:
        raise CodecUnavailable(f"unknown codec {name!r}; known: {', '.join(sorted(CODECS))}") from None


def codec_for(name: str, preferred: Codec) -> Codec:
    """The codec a bucket names in ``enc``: the queue's own when it matches, else a built-in one."""
    return preferred if name == preferred.name else codec_named(name)


def codec_option(codec: str | Codec) -> Codec:
    """The ``codec=`` option of a queue or stream: a codec's name or a codec object; ``InvalidOption`` else."""
    if isinstance(codec, str):
        try:
            return codec_named(codec)
        except ValueError as exc:
            raise InvalidOption(str(exc)) from None
    if not isinstance(codec, Codec):
        raise InvalidOption("codec must be a name or an object with name, dump and load")
    return codec

"""Payload codecs: how a payload becomes the bytes or text stored in a bucket's ``p`` array.

A codec is any object with ``name``, ``text`` (True when ``dump`` returns ``str``, stored as a BSON string;
False for ``bytes``, stored as BSON binary), ``dump(payload)`` and ``load(stored)``. The codec name is
written into each bucket (``enc``) so readers in other languages know how to decode it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import orjson


@runtime_checkable
class Codec(Protocol):
    name: str
    text: bool

    def dump(self, payload: Any) -> str | bytes: ...

    def load(self, stored: str | bytes) -> Any: ...


class JsonCodec:
    """JSON through orjson, stored as UTF-8 text. The default: fastest to encode and Spark reads it with
    ``from_json``. Rejects NaN/Infinity (orjson writes them as null, which would silently change data)."""

    name = "json"
    text = True

    def dump(self, payload: Any) -> str:
        encoded = orjson.dumps(payload)
        if b"null" in encoded:  # NaN and ±inf become null: only then is the payload walked to check
            _reject_non_finite(payload)
        return encoded.decode()

    def load(self, stored: str | bytes) -> Any:
        return orjson.loads(stored)


class MsgpackCodec:
    """MessagePack, stored as BSON binary. Needs the ``msgpack`` extra."""

    name = "msgpack"
    text = False

    def __init__(self) -> None:
        import msgpack

        self._msgpack = msgpack

    def dump(self, payload: Any) -> bytes:
        return self._msgpack.packb(payload, use_bin_type=True)

    def load(self, stored: str | bytes) -> Any:
        return self._msgpack.unpackb(stored, raw=False, strict_map_key=False)


def _reject_non_finite(value: Any) -> None:
    """orjson encodes NaN and Infinity as null; refuse them instead of storing something else.
    Run only when the encoded text contains ``null``; ``x - x`` is NaN exactly for NaN and ±inf."""
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


CODECS: dict[str, type] = {"json": JsonCodec, "msgpack": MsgpackCodec}


def codec_named(name: str) -> Codec:
    try:
        return CODECS[name]()
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(sorted(CODECS))}") from None


def codec_for(name: str, preferred: Codec) -> Codec:
    """The codec a bucket names in ``enc``: the queue's own when it matches, else a built-in one."""
    return preferred if name == preferred.name else codec_named(name)

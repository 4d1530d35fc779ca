"""Measure payload layouts for a bucket document (the figures in docs/FORMAT.md): encode and decode time
of 1024 payloads and the document size, for each candidate layout. ``python -m bench.profiling.measure_layout``."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
from bson import ObjectId, decode, encode

N = 1024
REPEATS = 30


def payload(i: int, pad: int) -> dict[str, Any]:
    return {"account": f"acct-{i % 97}", "amount": i * 0.5, "seq": i, "tags": ["a", "b"], "pad": "x" * pad}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    for _ in range(REPEATS):
        result = fn()
    return (time.perf_counter() - start) / REPEATS * 1e3, result


def layouts(ps: list[dict[str, Any]]) -> dict[str, tuple[Callable[[], bytes], Callable[[bytes], Any]]]:
    """Each candidate layout's encoder of ``ps`` into one document, and its decoder back to the payloads."""
    return {
        "p: [json text]": (lambda: encode({"_id": ObjectId(), "p": [orjson.dumps(p).decode() for p in ps]}),
                           lambda d: [orjson.loads(s) for s in decode(d)["p"]]),
        "p: [json binData]": (lambda: encode({"_id": ObjectId(), "p": [orjson.dumps(p) for p in ps]}),
                              lambda d: [orjson.loads(s) for s in decode(d)["p"]]),
        "p: [BSON subdocument]": (lambda: encode({"_id": ObjectId(), "p": ps}), lambda d: decode(d)["p"]),
        "m: [{p: json text}]": (
            lambda: encode({"_id": ObjectId(), "m": [{"p": orjson.dumps(p).decode()} for p in ps]}),
            lambda d: [orjson.loads(m["p"]) for m in decode(d)["m"]]),
    }


def main() -> None:
    for pad in (30, 950):
        ps = [payload(i, pad) for i in range(N)]
        size = len(orjson.dumps(ps[0]))
        print(f"{N} payloads of ~{size} B as JSON")
        for name, (enc, dec) in layouts(ps).items():
            enc_ms, doc = timed(enc)
            dec_ms, _ = timed(partial(dec, doc))
            print(f"  {name:24} encode {enc_ms:6.2f} ms  decode {dec_ms:6.2f} ms  {len(doc):>9,} bytes")


if __name__ == "__main__":
    main()

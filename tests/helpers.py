"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

PATIENCE_S = 20.0  # how long a test waits for what must happen: generous, so a loaded CI machine cannot fail it


async def eventually(condition: Callable[[], bool | Awaitable[bool]], timeout: float = PATIENCE_S,
                     what: str = "the condition") -> None:
    """Wait until ``condition()`` (a bool, or an awaitable of one) holds, checking every 10 ms; fail when it
    still does not after ``timeout`` seconds. For a test that waits for something to happen, rather than for
    a fixed time that a slow machine may overrun."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout:g} s"
        await asyncio.sleep(0.01)


async def read_all(reader: Any, *, ack: bool = True, timeout: float = 0.3, n: int = 100,
                   want: int | None = None) -> list[Any]:
    """Every message a ``bucketq.StreamReader`` gets until none comes for ``timeout`` seconds (or, given ``want``,
    until it has that many, its acks written, as the silence gave them time to be, then none other within a short
    silence: a test that knows what must come need not wait out the whole silence after it), acked."""
    out: list[Any] = []
    while (want is None or len(out) < want) and (batch := await reader.read_many(n, timeout=timeout)):
        for message in batch:
            if ack:
                await message.ack()
        out.extend(batch)
    if want is not None and len(out) >= want:
        if ack:
            await reader.flush()
        extra = await reader.read(timeout=0.1)
        assert extra is None, f"a message past the {want} wanted: {extra.payload!r}"
    return out

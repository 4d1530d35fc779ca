"""Reading stdin line by line without blocking the event loop (bucket writes go on while input is awaited)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

CHUNK = 1 << 16


async def read_lines(fd: int) -> AsyncIterator[tuple[bytes, int]]:
    """Yield ``(line, bytes consumed so far)`` for each line of ``fd``, the last one even without a newline."""
    buffer = bytearray()
    consumed = 0
    while chunk := await asyncio.to_thread(os.read, fd, CHUNK):
        buffer += chunk
        end = buffer.rfind(b"\n")
        if end < 0:
            continue
        complete, buffer = bytes(buffer[:end]), buffer[end + 1:]
        for line in complete.split(b"\n"):
            consumed += len(line) + 1
            yield line, consumed
    if buffer:
        yield bytes(buffer), consumed + len(buffer)

"""Carrying a sans-I/O conversation (``claim_step``, ``group_turn``, ``batch_attempt``, ``stream_read``) to a store:
each step the generator yields goes to ``execute``, and its reply back in, until the generator returns its result.

Both carriers, the synchronous ``carry`` and the asynchronous ``carry_async``, treat errors alike: an error
raised by ``execute`` (a cancellation too) is thrown into the generator at the ``yield`` of the step that raised
it, so that a conversation can still take a step on its way out (give a lock back) as a ``try``/``finally`` around
a call would; one it does not catch ends it and goes on to the caller. Neither imports asyncio: the async carrier
only awaits what ``execute`` returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

Step = TypeVar("Step")
Result = TypeVar("Result")


def carry(conversation: Generator[Step, Any, Result], execute: Callable[[Step], Any]) -> Result:
    """Run ``conversation`` to its end with ``execute`` as the store."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = conversation.send(reply) if error is None else conversation.throw(error)
        except StopIteration as done:
            return done.value
        try:
            reply, error = execute(step), None
        except BaseException as exc:
            reply, error = None, exc


async def carry_async(conversation: Generator[Step, Any, Result], execute: Callable[[Step], Awaitable[Any]]) -> Result:
    """``carry`` with an ``execute`` to await."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = conversation.send(reply) if error is None else conversation.throw(error)
        except StopIteration as done:
            return done.value
        try:
            reply, error = await execute(step), None
        except BaseException as exc:  # a cancellation too: the conversation takes its way out, then raises it
            reply, error = None, exc

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
from typing import Any, Generic, TypeVar

Step = TypeVar("Step")
Result = TypeVar("Result")


class _Turns(Generic[Step, Result]):
    """The conversation's side of a carrier, one place for both: the next step, with the last reply sent in or the
    last error thrown in; the result once the generator returns."""

    def __init__(self, conversation: Generator[Step, Any, Result]) -> None:
        self._conversation = conversation
        self._reply: Any = None
        self._error: BaseException | None = None
        self.step: Step
        self.result: Result

    def next(self) -> bool:
        """Take the next step (``step``); False once the conversation has returned (``result``)."""
        try:
            if self._error is None:
                self.step = self._conversation.send(self._reply)
            else:
                self.step = self._conversation.throw(self._error)
        except StopIteration as done:
            self.result = done.value
            return False
        return True

    def answered(self, reply: Any) -> None:
        self._reply, self._error = reply, None

    def failed(self, error: BaseException) -> None:
        self._reply, self._error = None, error


def carry(conversation: Generator[Step, Any, Result], execute: Callable[[Step], Any]) -> Result:
    """Run ``conversation`` to its end with ``execute`` as the store."""
    turns = _Turns(conversation)
    while turns.next():
        try:
            turns.answered(execute(turns.step))
        except BaseException as exc:
            turns.failed(exc)
    return turns.result


async def carry_async(conversation: Generator[Step, Any, Result], execute: Callable[[Step], Awaitable[Any]]) -> Result:
    """``carry`` with an ``execute`` to await."""
    turns = _Turns(conversation)
    while turns.next():
        try:
            turns.answered(await execute(turns.step))
        except BaseException as exc:  # a cancellation too: the conversation takes its way out, then raises it
            turns.failed(exc)
    return turns.result

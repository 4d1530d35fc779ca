"""Carrying a sans-I/O conversation (``group_turn``, ``batch_attempt``) synchronously: each step the generator
yields goes to ``execute``, and its reply back in, until the generator returns its result."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

Step = TypeVar("Step")
Result = TypeVar("Result")


def carry(conversation: Generator[Step, Any, Result], execute: Callable[[Step], Any]) -> Result:
    """Run ``conversation`` to its end with ``execute`` as the store; an error raised by ``execute`` ends it."""
    reply: Any = None
    while True:
        try:
            step = conversation.send(reply)
        except StopIteration as done:
            return done.value
        reply = execute(step)

"""The operation log and fault injection of ``bucketq.memory``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Operation:
    """One operation as the database received it. ``command`` is the wire command (``insert``, ``update``,
    ``delete``, ``findAndModify``, ``find``, ``aggregate``, ``count``, ``createIndexes``, ``watch``,
    ``isMaster``, ...), ``method`` the method called (``insert_many``, ``replace_one``, ...). ``filter`` and
    ``update`` (an update document, a replacement or a pipeline) are the objects the caller passed; ``ids``
    are the ``_id``s an insert carried. ``fault`` names the fault injected into it, if any."""

    command: str
    method: str
    database: str
    collection: str | None = None
    filter: Any = None
    update: Any = None
    ids: tuple[Any, ...] = ()
    fault: str | None = None


class OperationLog(list[Operation]):
    """Every operation received, in order (a list); ``of(...)`` selects some."""

    def of(self, *commands: str, collection: str | None = None) -> list[Operation]:
        """The operations whose command or method is one of ``commands`` (all when none given), on
        ``collection`` if given."""
        return [op for op in self if (not commands or op.command in commands or op.method in commands)
                and (collection is None or op.collection == collection)]


@dataclass(eq=False)
class Fault:
    """What to do to the next ``times`` matching operations; ``hits`` counts those it acted on."""

    action: str  # lose_reply | refuse | delay
    commands: frozenset[str]
    times: int
    collection: str | None = None
    where: Callable[[Operation], bool] | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    until: asyncio.Event | None = None
    hits: int = 0

    def matches(self, op: Operation) -> bool:
        """Whether this fault applies to ``op``: armed, and the command, collection and predicate match."""
        return (self.times > 0 and (not self.commands or op.command in self.commands or op.method in self.commands)
                and (self.collection is None or op.collection == self.collection)
                and (self.where is None or bool(self.where(op))))


class Faults:
    """Faults to inject into the next operations that match a command or method name (any when none is
    given), a collection and a predicate on the ``Operation``. Faults are tried in the order they were
    armed; the first that matches acts, once per operation."""

    def __init__(self) -> None:
        self._armed: list[Fault] = []

    def lose_reply(self, *commands: str, times: int = 1, collection: str | None = None,
                   where: Callable[[Operation], bool] | None = None) -> Fault:
        """Apply the operation, then raise ``AutoReconnect``: the caller cannot tell whether it was applied."""
        return self._arm(Fault("lose_reply", frozenset(commands), times, collection, where))

    def refuse(self, *commands: str, times: int = 1, collection: str | None = None,
               where: Callable[[Operation], bool] | None = None, error: BaseException | None = None) -> Fault:
        """Raise before applying the operation: ``error`` (a copy of it each time), by default ``AutoReconnect``
        (a request lost on its way, which callers retry); pass e.g. a ``WriteError`` for a refusal they do not."""
        return self._arm(Fault("refuse", frozenset(commands), times, collection, where, error=error))

    def delay(self, *commands: str, seconds: float = 0.0, until: asyncio.Event | None = None, times: int = 1,
              collection: str | None = None, where: Callable[[Operation], bool] | None = None) -> Fault:
        """Hold the operation back ``seconds``, or until ``until`` is set, then apply it (other operations go
        on meanwhile)."""
        return self._arm(Fault("delay", frozenset(commands), times, collection, where, seconds=seconds, until=until))

    def disarm(self) -> None:
        """Forget every fault not yet used up."""
        self._armed.clear()

    def _arm(self, fault: Fault) -> Fault:
        if fault.times < 1:
            raise ValueError("times must be at least 1")
        self._armed.append(fault)
        return fault

    def take(self, op: Operation) -> Fault | None:
        """The first armed fault that matches ``op``, used up by one (None when none matches)."""
        for fault in self._armed:
            if fault.matches(op):
                fault.times -= 1
                fault.hits += 1
                return fault
        return None

"""The consumer's side of an ordered group's turn: it carries ``core.group_turn``'s conversations to the store."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

from bucketq.core import group_turn
from bucketq.core.conversation import carry_async
from bucketq.core.group_turn import GroupStep
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.queue_store import AsyncQueueStore

T = TypeVar("T")


class OrderedGroupTurns:
    """Carries an ordered group's conversations to ``store``; a bucket woken for a group's next turn wakes
    ``wakeup``."""

    def __init__(self, store: AsyncQueueStore, wakeup: Wakeup) -> None:
        self._store = store
        self._wakeup = wakeup

    async def converse(self, conversation: Generator[GroupStep, Any, T]) -> T:
        """Carry an ordered group's conversation (``core.group_turn``) to the store (``conversation.carry_async``:
        an error is thrown in at the step that raised it, as the lock may still have to be given back)."""
        return await carry_async(conversation, self.step)

    async def step(self, step: GroupStep) -> Any:
        """One step of an ordered group's conversation, carried to the store."""
        store = self._store
        match step:
            case group_turn.LockGroup(query, update, mine):
                return await store.lock_group(query, update, mine)
            case group_turn.ReadEarliestLive(query, sort):
                return await store.first_bucket(query, sort)
            case group_turn.ReleaseToWait(query, update, mine):
                return await store.update_fenced(query, update, mine=mine)
            case group_turn.Unlock(mine):
                return await store.unlock_group(mine)
            case group_turn.ReadLock(group):
                return await store.group_lock(group)
            case group_turn.Wake(query, update):
                await store.wake(query, update)
                self._wakeup.notify()
                return None

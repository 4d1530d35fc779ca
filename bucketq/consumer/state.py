"""``ConsumerState``: the state that the consumer's parts (one module each: claiming, decoding, ordered group
turns, flushing, draining) share, and what each part calls of another. ``Consumer`` sets it all up."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from bucketq import metrics
from bucketq.codecs import Codec
from bucketq.consumer.dedupe_keys import KeyRecorder
from bucketq.consumer.finishing import Finishes
from bucketq.consumer.holding import Holding
from bucketq.core.backoff import Backoff
from bucketq.core.claim_step import Claimer
from bucketq.core.format import StoredBucket
from bucketq.core.group_turn import GroupStep
from bucketq.core.held import ClaimedBucket, Policy
from bucketq.core.priorities import Turns
from bucketq.core.sharding import Rotation
from bucketq.message import Message
from bucketq.options import QueueOptions
from bucketq.shell.clock import ServerClock
from bucketq.shell.pause_gate import PauseGate
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.queue_store import AsyncQueueStore

T = TypeVar("T")


class ConsumerState:
    _store: AsyncQueueStore
    _codec: Codec
    _options: QueueOptions
    _clock: ServerClock
    _wakeup: Wakeup
    _pause: PauseGate
    _before_claim: Callable[[], Awaitable[None]]
    _backoff: Backoff
    _policy: Policy
    _claimer: Claimer
    _holdings: list[Holding]
    _claim_lock: asyncio.Lock
    _flusher: asyncio.Task[None] | None  # the flush loop
    _background: set[asyncio.Task[Any]]
    _draining: bool
    _owner: str
    _found_in_a_row: int
    _ahead: asyncio.Task[None] | None
    _ahead_unsent: bool
    _keys: KeyRecorder
    _finishes: Finishes
    _metrics: metrics.Metrics
    _rotation: Rotation
    _turns: Turns
    claim_counts: Counter[bool]

    if TYPE_CHECKING:  # what the parts call of each other
        def _next_message(self) -> Message | None: ...

        def _backlog(self, newest: ClaimedBucket) -> bool: ...

        async def _claim(self, only: dict | None = None) -> bool: ...

        async def _ahead_landed(self) -> None: ...

        async def _claims_landed(self) -> None: ...

        def _decode(self, bucket: StoredBucket, codec: Codec) -> tuple[list[Any], dict[int, str]]: ...

        def _undecodable(self, holding: Holding, slot: int, exc: Exception) -> None: ...

        def _decoded(self, holding: Holding, slots: list[int]) -> tuple[list[int], list[Any]]: ...

        async def _quarantine_bucket(self, doc: dict, token: str, reason: str) -> None: ...

        async def _group_step(self, step: GroupStep) -> Any: ...

        async def _converse(self, conversation: Generator[GroupStep, Any, T]) -> T: ...

        def _start(self) -> None: ...

        def _spawn(self, coro: Any) -> asyncio.Task[Any]: ...

        def _schedule_flush(self, holding: Holding) -> None: ...

        async def _flush(self, holding: Holding, *, release: bool = False) -> None: ...

        async def _end_turn(self, group: str, partition: int | None, token: str) -> None: ...

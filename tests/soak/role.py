"""What every soak role process shares: ``python -m tests.soak.<role> URI DB RUN_DIR PROC [role flags]``.

A role runs ``body(ctx)`` until SIGTERM (``ctx.stop``), writing its history as it acts. Beside it: the clock
resync and the process's own samples (``tasks``: ``len(asyncio.all_tasks())``) every few seconds; SIGUSR1 steps
the wall clock (``time.time``) by the seconds in ``<run>/clock/<proc>`` (``tests/stress/consumer.py``'s
``ClockStepper``: bucketq and the history read the monotonic clock, so only what reads the wall clock moves);
the slow phase is on while ``<run>/slow`` exists (``ctx.slow``: consumers take longer per message, so the
backlog grows). ``<run>/ready/<proc>`` says the signal handlers are installed (SIGUSR1 would kill it before).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

import bucketq
from tests.soak.faults import LEASE_S
from tests.soak.history import RESOURCE_EVERY_S, History
from tests.stress.consumer import ClockStepper

QUEUE = "jobs"  # plain, delayed, prioritised, unique, grouped, outbox messages: the Workers' and consumers'
RATED = "rated"  # the rate-limited queue
BULK = "bulk"  # the BatchQueue's
TICKS = "ticks"  # the schedule's
STREAM = "events"
RATE_LIMIT = {"count": 20, "per_s": 1.0}
UNIQUE_FOR_S = 30.0
MAX_ATTEMPTS = 6
WRITE_TIMEOUT_S = 30.0  # a write retries through restarts, stalls and cuts (seconds each) well within this
TOMBSTONES_KEPT_S = 2 * WRITE_TIMEOUT_S + 5.0  # must exceed write_timeout (a retried insert must meet its tombstone)
SLOW_POLL_S = 0.5


def queue_options() -> dict[str, Any]:
    """Short leases and quick retries, so that a killed process's work comes back within seconds and a failing
    message reaches its dead letter within the run; tombstones kept a minute, not ten, so that their count levels
    off early in the run (the resource trends judge it). Producers push one message at a time: a bucket gathers
    what a fifth of a second brings (at 0.05 s the slow phase left 340 one-message buckets, each claim scanning
    them all on the test server, and the drain took 80 s)."""
    return {"lease": LEASE_S, "state_flush_period": 0.4, "max_attempts": MAX_ATTEMPTS, "write_timeout": WRITE_TIMEOUT_S,
            "tombstone_retention": TOMBSTONES_KEPT_S, "bucket_max_size": 50, "bucket_max_wait": 0.2,
            "poll_interval": 0.1, "drain_timeout": 5.0, "retry_base": 0.2, "retry_max": 2.0}


@dataclass
class Context:
    """A role's process: its history, its client and database, the stop and slow-phase flags, its flags."""

    history: History
    client: AsyncMongoClient[Any]
    db_name: str
    args: argparse.Namespace
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_hooks: list[Callable[[], None]] = field(default_factory=list)  # called on SIGTERM too (Worker.stop)
    slow: bool = False

    def request_stop(self) -> None:
        """SIGTERM: stop the role, and whatever registered a stop hook."""
        self.stop.set()
        for hook in self.stop_hooks:
            hook()

    @property
    def db(self) -> Any:
        """The run's database."""
        return self.client[self.db_name]

    def queue(self, name: str = QUEUE, **options: Any) -> bucketq.Queue:
        """A queue of the run with the soak's options (``queue_options``), overridden by ``options``."""
        return bucketq.Queue(self.client, name=name, db=self.db_name, **{**queue_options(), **options})

    async def pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless stopped meanwhile; True when stopped."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            return False
        return True


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every role takes; a role adds its own."""
    p = argparse.ArgumentParser(description=description)
    for name in ("uri", "db", "run_dir", "proc"):
        p.add_argument(name)
    p.add_argument("--seed", type=int, default=0)
    return p


def run(body: Callable[[Context], Awaitable[None]], args: argparse.Namespace) -> int:
    """Run a role's ``body`` in this process until SIGTERM; its exit status."""
    return asyncio.run(_main(body, args))


async def _main(body: Callable[[Context], Awaitable[None]], args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    history = History(run_dir, args.proc)
    client: AsyncMongoClient[Any] = AsyncMongoClient(args.uri, tz_aware=True, serverSelectionTimeoutMS=60_000)
    ctx = Context(history, client, args.db, args)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, ctx.request_stop)
    stepper = ClockStepper(str(run_dir / "clock" / args.proc))
    loop.add_signal_handler(signal.SIGUSR1, stepper.step)
    (run_dir / "ready" / args.proc).touch()
    await _sync(ctx)
    sampler = asyncio.create_task(_sample(ctx))
    slow = asyncio.create_task(_follow_slow(ctx, run_dir / "slow"))
    try:
        await body(ctx)
    finally:
        sampler.cancel()
        slow.cancel()
        history.close()
        await client.close()
    return 0


async def _sync(ctx: Context) -> None:
    try:
        await ctx.history.sync(ctx.db)
    except PyMongoError as exc:  # a restart or a stall: the clock runs on its last anchor meanwhile
        print(f"{ctx.history.proc}: clock sync failed: {exc}", file=sys.stderr)


async def _follow_slow(ctx: Context, flag: Path) -> None:
    while True:
        ctx.slow = flag.exists()
        await asyncio.sleep(SLOW_POLL_S)


async def _sample(ctx: Context) -> None:
    while True:
        ctx.history.sample("tasks", len(asyncio.all_tasks()))
        await asyncio.sleep(RESOURCE_EVERY_S)
        await _sync(ctx)

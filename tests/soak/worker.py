"""A soak worker: ``python -m tests.soak.worker URI DB RUN_DIR PROC [--sync]``: a ``bucketq.Worker`` on ``jobs``
running the soak handlers (``handlers.py``), async with ``concurrency=4``, or with ``--sync`` a plain ``def`` on
``threads=3`` (one more than its concurrency: a call cut off by ``handler_timeout`` keeps its thread)."""

from __future__ import annotations

import sys

import bucketq
from tests.soak import role
from tests.soak.handlers import HANDLER_TIMEOUT_S, Recorder, async_handler, sync_handler


async def work(ctx: role.Context) -> None:
    """Run the ``Worker`` until stopped; it drains the queue on its way out."""
    q = ctx.queue()
    recorder = Recorder(ctx.history, q.name)
    if ctx.args.sync:
        handler, options = sync_handler(recorder, lambda: ctx.slow), {"concurrency": 2, "threads": 3}
    else:
        handler, options = async_handler(recorder, lambda: ctx.slow), {"concurrency": 4}
    worker = bucketq.Worker(q, handler, handle_signals=False, handler_timeout=HANDLER_TIMEOUT_S,
                            on_error=recorder.on_error, **options)
    ctx.stop_hooks.append(worker.stop)
    await worker.run()  # drains the queue (flush, release) once stopped
    await q.close()


def main() -> int:
    """The role's entry point."""
    p = role.parser(__doc__ or "")
    p.add_argument("--sync", action="store_true", help="a sync handler on the worker's threads")
    return role.run(work, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())

"""The fleet cell: many idle consumers of one queue, in two shapes, then a burst of work.

``python -m bench.fleet [--quick] [--many 10x100] [--one 100x1] [--window 200] [--burst-buckets 4]``

Shapes (each ``PROCESSESxQUEUES``: processes, and queue objects consuming in each, all on one client per process):
``many`` (many queue objects per process) and ``one`` (one per process, the autoscaled-workers shape), and
``single`` (one consumer alone), the reference for wake-up latency. The three run at once, on queues of their
own, against one server. Each consumer runs a Worker's idle loop (``reserve(timeout=10)``). After every consumer's
change streams answered, the commands each process sends are counted by kind over ``--window`` seconds (at least
three housekeeping periods of 60 s in the full run); then a burst of ``--burst-buckets`` buckets is pushed to
each queue, and the cell reports the claims per bucket (empty ones included) and the wake-up latency of the
burst's first message (push to handler).

Counted on the client side (a command listener: driver heartbeats never reach it): commands a second by kind,
getMores a second, change streams opened (the ``$changeStream`` aggregates) per process; and at the end of the
window, as the server counts them where it reports them (``serverStatus``, every shape's at once), connections
and open cursors (change streams among them). Against the test
server an empty getMore is answered at once (the consumer then pauses up to a second), not held for
``maxAwaitTimeMS`` as MongoDB does: getMores a second are the test server's. Results:
``bench/results/fleet.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient, MongoClient, monitoring

from bench.server import DB, server
from bucketq.shell.wakeup import SAFETY_POLL_S

RESULTS = Path(__file__).resolve().parent / "results" / "fleet.json"
IDLE_GOAL_PER_1000 = 20.0  # commands a second besides getMores per 1,000 idle consumers
LATENCY_SLACK = 1.5  # the fleets' first wake-up within this factor of the lone consumer's (plus 100 ms)
BUCKET_SIZE = 10


class _Counted(monitoring.CommandListener):
    """Commands started, by kind: ``getMore``, ``watch`` (an aggregate opening a change stream), or the
    command's name and collection."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = event.command_name
        if name == "getMore":
            self.kinds["getMore"] += 1
        elif name == "aggregate" and "$changeStream" in (event.command.get("pipeline") or [{}])[0]:
            self.kinds["watch"] += 1
        else:
            target = event.command.get(name)
            self.kinds[f"{name} {target}" if isinstance(target, str) else name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def _consumers(uri: str, shape: str, count: int, phases: Any, out: Any) -> None:
    import bucketq

    counted = _Counted()
    client: AsyncMongoClient = AsyncMongoClient(uri, event_listeners=[counted], tz_aware=True)
    queues = [bucketq.Queue(client, name=f"fleet_{shape}", db=DB) for _ in range(count)]
    received: list[float] = []

    async def worker(q: bucketq.Queue) -> None:  # a Worker's idle loop, recording when each message arrives
        while True:
            message = await q.reserve(timeout=10)
            if message is not None:
                received.append(time.time() - message.payload["t"])
                await message.ack()

    for q in queues:
        await q.reserve(timeout=0)
    while not all(q._wakeup.streaming for q in queues):
        await asyncio.sleep(0.1)
    for q in queues:  # the claim that sets a streaming consumer's safety poll far off, before the window
        await q.reserve(timeout=0)
    tasks = [asyncio.ensure_future(worker(q)) for q in queues]
    out.put(("ready", shape, None))
    await asyncio.to_thread(phases["go"].wait)
    idle0, began = Counter(counted.kinds), time.monotonic()
    await asyncio.to_thread(phases["burst"].wait)
    idle = {"window_s": time.monotonic() - began, "kinds": dict(counted.kinds - idle0)}
    claims0 = [Counter(q._consumer.claim_counts) for q in queues]
    await asyncio.to_thread(phases["done"].wait)
    claims = [q._consumer.claim_counts - c0 for q, c0 in zip(queues, claims0, strict=True)]
    out.put(("result", shape, {"idle": idle, "watches": counted.kinds["watch"], "received": received,
                        "claims_found": sum(c[True] for c in claims), "claims_empty": sum(c[False] for c in claims),
                        "woken": sum(1 for c in claims if c[True] or c[False])}))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for q in queues:
        await q.close()
    await client.close()


def _process(uri: str, shape: str, count: int, phases: Any, out: Any) -> None:
    asyncio.run(_consumers(uri, shape, count, phases, out))


async def _burst(uri: str, queues: list[str], buckets: int) -> None:
    import bucketq

    for name in queues:
        async with bucketq.Queue(uri, name=name, db=DB, bucket_max_size=BUCKET_SIZE, bucket_max_wait=5) as q:
            for _ in range(buckets):
                await q.push_many([{"t": time.time()} for _ in range(BUCKET_SIZE)])


def _progress(text: str) -> None:
    print(f"fleet: {text}", file=sys.stderr, flush=True)


def _shape(text: str) -> tuple[int, int]:
    processes, _, queues = text.partition("x")
    return int(processes), int(queues)


def run(uri: str, shapes: dict[str, tuple[int, int]], window_s: float, buckets: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    phases = {name: context.Event() for name in ("go", "burst", "done")}
    out: Any = context.Queue()
    procs: dict[str, list[Any]] = {}
    sync: MongoClient = MongoClient(uri)
    with sync:
        sync.drop_database(DB)
    for shape, (processes, per) in shapes.items():
        procs[shape] = [context.Process(target=_process, args=(uri, shape, per, phases, out))
                        for _ in range(processes)]
    every = [p for ps in procs.values() for p in ps]
    for proc in every:
        proc.start()
    for ready in range(1, len(every) + 1):
        assert out.get(timeout=600)[0] == "ready"
        if ready % 10 == 0 or ready == len(every):
            _progress(f"{ready}/{len(every)} processes idle, their change streams answering")
    phases["go"].set()
    end = time.monotonic() + window_s
    while (left := end - time.monotonic()) > 0:
        _progress(f"idle window: {left:.0f} s left")
        time.sleep(min(30.0, left))
    _progress("the burst")
    counted_by_server = _server_counts(uri)
    phases["burst"].set()
    time.sleep(1.0)  # every process has taken its claim counts
    asyncio.run(_burst(uri, [f"fleet_{shape}" for shape in shapes], buckets))
    time.sleep(5.0)
    phases["done"].set()
    results: dict[str, list[dict]] = {shape: [] for shape in shapes}
    for _ in every:
        _, shape, result = out.get(timeout=120)
        results[shape].append(result)
    for proc in every:
        proc.join(60)
    return {"server_counts": counted_by_server,
            **{shape: _summary(results[shape], *shapes[shape], buckets) for shape in shapes}}


def _server_counts(uri: str) -> dict[str, Any]:
    """Connections and open cursors (change streams among them) as the server counts them, every shape's at
    once, where it reports them (``serverStatus``)."""
    sync: MongoClient = MongoClient(uri)
    with sync:
        status = sync.admin.command("serverStatus")
    cursors = status.get("metrics", {}).get("cursor", {}).get("open", {}).get("total")
    return {"connections": status.get("connections", {}).get("current"), "open_cursors": cursors}


def _summary(results: list[dict], processes: int, per: int, buckets: int) -> dict[str, Any]:
    consumers = processes * per
    kinds: Counter[str] = Counter()
    window = max(r["idle"]["window_s"] for r in results)
    for r in results:
        kinds.update(r["idle"]["kinds"])
    getmores = kinds.pop("getMore", 0)
    watches = kinds.pop("watch", 0)
    # The housekeeping round's deletes are the queue's, one round a minute however many consume it: a fleet of
    # 1,000 sends as many as this one. The rest is each consumer's own, scaled to 1,000.
    per_queue = sum(n for kind, n in kinds.items() if kind.startswith("delete "))
    per_consumer = sum(kinds.values()) - per_queue
    # A window shorter than a few safety polls sees too few of them (the consumers, started together, poll first
    # 270-330 s after their warm-up): they count at their mean rate at least, three commands each (a claim, a
    # read of the next due time, a clock resync).
    seen = sum(n for kind, n in kinds.items()
               if kind.startswith(("findAndModify ", "find ", "isMaster", "hello")) and ".control" not in kind)
    polls = max(seen, consumers * 3 * window / (sum(SAFETY_POLL_S) / 2))
    per_consumer += polls - seen
    latencies = sorted(x for r in results for x in r["received"])
    return {
        "processes": processes, "queues_per_process": per, "consumers": consumers, "window_s": round(window, 1),
        "commands_per_s": {kind: round(n / window, 3) for kind, n in kinds.most_common()},
        "non_getmore_per_s_per_1000": round((per_consumer * 1000 / consumers + per_queue) / window, 2),
        "safety_poll_commands_seen": seen, "safety_poll_commands_counted": round(polls, 1),
        "getmores_per_s": round(getmores / window, 1), "watches_in_window": watches,
        "change_streams_per_process": max(r["watches"] for r in results),
        "burst_buckets": buckets, "burst_messages": len(latencies),
        "claims_per_bucket": round(sum(r["claims_found"] + r["claims_empty"] for r in results) / buckets, 2),
        "consumers_woken": sum(r["woken"] for r in results),
        "first_wakeup_s": round(latencies[0], 3) if latencies else None,
    }


def goals(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(PASS | MISS, goal, detail) of the cell."""
    out = []
    for shape in ("many", "one"):
        if shape not in report:
            continue
        row = report[shape]
        rate = row["non_getmore_per_s_per_1000"]
        out.append(("PASS" if rate <= IDLE_GOAL_PER_1000 else "MISS",
                    f"fleet {shape}: <= {IDLE_GOAL_PER_1000:g} cmds/s besides getMores per 1,000 idle consumers",
                    f"{rate:.1f} with {row['consumers']} consumers in {row['processes']} process(es) over "
                    f"{row['window_s']:g} s"))
    if "many" in report:
        row = report["many"]
        streams = row["change_streams_per_process"]
        out.append(("PASS" if streams <= 2 else "MISS", "fleet many: change streams per process, not per queue",
                    f"{streams} opened by a process of {row['queues_per_process']} queue objects"))
    lone = report.get("single", {}).get("first_wakeup_s")
    for shape in ("many", "one"):
        first = report.get(shape, {}).get("first_wakeup_s")
        if lone is None or first is None:
            continue
        out.append(("PASS" if first <= lone * LATENCY_SLACK + 0.1 else "MISS",
                    f"fleet {shape}: burst's first wake-up no later than a lone consumer's",
                    f"{first:.3f} s vs {lone:.3f} s; {report[shape]['claims_per_bucket']:g} claims per bucket, "
                    f"{report[shape]['consumers_woken']} consumers woken by {report[shape]['burst_buckets']} "
                    "buckets"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2x50 and 10x1, a 200 s window")
    parser.add_argument("--many", default=None, help="PROCESSESxQUEUES (default 10x100)")
    parser.add_argument("--one", default=None, help="PROCESSESxQUEUES (default 100x1)")
    parser.add_argument("--window", type=float, default=None, help="idle seconds counted (default 400)")
    parser.add_argument("--burst-buckets", type=int, default=4)
    args = parser.parse_args()
    many = _shape(args.many or ("2x50" if args.quick else "10x100"))
    one = _shape(args.one or ("10x1" if args.quick else "100x1"))
    window = args.window or (200.0 if args.quick else 400.0)
    with server() as srv:
        print(f"server: {srv.label} (the test server answers an empty getMore at once: its getMores a second are "
              "its own)" if srv.embedded is not None else f"server: {srv.label}", flush=True)
        report = run(srv.uri, {"single": (1, 1), "many": many, "one": one}, window, args.burst_buckets)
        srv.drop_bench_db()
    for shape, row in report.items():
        print(f"{shape}: {json.dumps(row)}")
    verdicts = goals(report)
    for status, goal, detail in verdicts:
        print(f"{status:4}  {goal}: {detail}")
    RESULTS.write_text(json.dumps({"server": srv.label, "fleet": report,
                                   "goals": [{"status": s, "goal": g, "detail": d} for s, g, d in verdicts]},
                                  indent=1) + "\n")


if __name__ == "__main__":
    main()

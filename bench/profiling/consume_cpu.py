"""CPU seconds a consumed message costs the client, split into user, system and garbage-collection time:
what the instruction counts of ``bench.profiling.consume_instructions`` leave out (the kernel's share, and how fast the
instructions run: the collector's walks of the heap miss the caches).

For each of two queue sizes: fill a queue with 1 KiB messages (buckets of 1,024; untimed), then consume all of it in
a child process as ``consume_instructions`` does (the floor, ``reserve`` + ``ack``, ``reserve_many(100)`` +
``ack_many``), timed with ``getrusage`` and with ``gc.callbacks`` around each collection. The smaller run is
subtracted from the larger, so that start-up, imports and set-up cancel out. ``--rounds`` runs each of the three in
turn that many times (the machine's load moved the floor's figure by a third between runs); the medians are printed,
with each figure over the floor's.

    python -m bench.profiling.consume_cpu [--rounds 3] [--messages 16384,81920]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import subprocess
import sys
import time

from bench.profiling.consume_instructions import DB, consume, consume_floor, fill

MODES = {"floor": (0, False), "reserve + ack": (1, False), "reserve_many(100) + ack_many": (100, True)}
FIGURES = ("user", "system", "gc")


def measured(uri: str, queue: str, batch: int, ack_many: bool) -> dict[str, float]:
    """In this process: consume ``queue``; the count, and the CPU seconds of user, system and collector time."""
    in_gc = {"s": 0.0, "since": 0.0}

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            in_gc["since"] = time.process_time()
        else:
            in_gc["s"] += time.process_time() - in_gc["since"]

    gc.callbacks.append(timed)
    before = resource.getrusage(resource.RUSAGE_SELF)
    n = consume_floor(uri, queue) if batch == 0 else asyncio.run(consume(uri, queue, batch, ack_many))
    after = resource.getrusage(resource.RUSAGE_SELF)
    gc.callbacks.remove(timed)
    return {"n": n, "user": after.ru_utime - before.ru_utime, "system": after.ru_stime - before.ru_stime,
            "gc": in_gc["s"]}


def per_message_us(small: dict[str, float], large: dict[str, float]) -> dict[str, float]:
    """Microseconds a message of each figure: the smaller run subtracted from the larger."""
    return {k: 1e6 * (large[k] - small[k]) / (large["n"] - small["n"]) for k in FIGURES}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each consumer, in turn")
    parser.add_argument("--messages", default="16384,81920", help="the two queue sizes, smaller first")
    parser.add_argument("--child", nargs=4, metavar=("URI", "QUEUE", "BATCH", "ACK_MANY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        uri, queue, batch, ack_many = args.child
        print(json.dumps(measured(uri, queue, int(batch), ack_many == "1")))
        return
    from bench.server import server

    sizes = [int(n) for n in args.messages.split(",")]
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with server() as srv:
        srv.drop_bench_db()
        for r in range(args.rounds):
            for mode, (batch, ack_many) in MODES.items():
                runs = []
                for n in sizes:
                    queue = f"cpu{r}_{batch}_{n}"
                    asyncio.run(fill(srv.uri, queue, n))
                    out = subprocess.run([sys.executable, "-m", __spec__.name, "--child", srv.uri, queue, str(batch),
                                          "1" if ack_many else "0"], capture_output=True, text=True, check=True)
                    runs.append(json.loads(out.stdout.splitlines()[-1]))
                results[mode].append(per_message_us(*runs))
                print(f"round {r + 1}/{args.rounds}, {mode}: " +
                      ", ".join(f"{k} {v:.2f}" for k, v in results[mode][-1].items()) + " µs a message", flush=True)
            srv.drop_bench_db()
    floor = sum(statistics.median(run[k] for run in results["floor"]) for k in ("user", "system"))
    print(f"medians of {args.rounds} rounds, µs a message ({DB}, {sizes[1]:,} minus {sizes[0]:,} messages):")
    for mode, runs in results.items():
        medians = {k: statistics.median(run[k] for run in runs) for k in FIGURES}
        total = medians["user"] + medians["system"]
        print(f"  {mode:30s} user {medians['user']:.2f} + system {medians['system']:.2f} = {total:.2f} "
              f"({total / floor:.2f}x the floor's), of which collecting garbage {medians['gc']:.2f}")


if __name__ == "__main__":
    main()

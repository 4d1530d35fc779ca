"""python -m bench [--quick] [options]: run the contenders against one server, print the table and the
goals, write bench/results/latest.json and bench/results/latest.png."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

from bench import plan, report, runner, spark_read
from bench.contenders import keuss
from bench.server import Server, server


def _keuss_problem(cfg: plan.Settings) -> str | None:
    """Install keuss if it takes part; the reason it cannot, or None."""
    if "keuss" not in cfg.contenders:
        return None
    try:
        version = keuss.ensure_installed()
    except Exception as exc:  # npm missing or failing: keuss rows say so, the rest still runs
        return f"error: keuss install failed: {exc}"
    print(f"keuss {version} (bucket-mongo-safe) ready in bench/.node/", file=sys.stderr)
    return None


def _run(cfg: plan.Settings, srv: Server, keuss_problem: str | None) -> list[dict]:
    def runnable(job: plan.Job) -> bool:
        return not (job.contender == "keuss" and keuss_problem)

    def warm_up() -> None:
        warmups = [job for job in plan.warmup_jobs(cfg) if runnable(job)]
        for number, job in enumerate(warmups, 1):
            runner.run_job(job, cfg, srv, f"[warm-up {number}/{len(warmups)}]")

    jobs, skipped = plan.jobs(cfg, srv.replica_set)
    warm_up()
    rows = []
    numbered = list(enumerate(jobs, 1))
    # The contenders of one cell (scenario, payload, processes, w) always share one server instance.
    for _, cell in itertools.groupby(numbered, key=lambda item: item[1].cell):
        cell = [(number, job) for number, job in cell if runnable(job)]
        if srv.make_room(cfg.rounds * sum(job.bytes_written for _, job in cell)):
            print("restarted the embedded test server (its in-memory oplog keeps every write)", file=sys.stderr)
            warm_up()
        # Rounds interleave the contenders, so that a slow minute of the machine falls on all of them; one run
        # of a job lasts a fraction of a second, and single runs of the same cell varied by a third.
        rounds: dict[int, list[dict]] = {number: [] for number, _ in cell}
        idle = all(job.scenario in plan.IDLE_SCENARIOS for _, job in cell)
        count = 1 if idle else cfg.rounds  # an idle cell is a count over a long window
        for round_ in range(1, count + 1):
            for number, job in cell:
                of = f" {round_}/{count}" if count > 1 else ""
                rounds[number].append(runner.run_job(job, cfg, srv, f"[{number:>2}/{len(jobs)}{of}]"))
        rows += [runner.median_round(rounds[number]) for number, _ in cell]
    rows += [plan.skip_row(job, keuss_problem or "") for job in jobs if not runnable(job)]
    if "spark" in cfg.scenarios:
        skipped += spark_read.rows(cfg, srv)
    return rows + skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    plan.add_arguments(parser)
    cfg = plan.settings(parser.parse_args(argv))
    started = time.monotonic()
    keuss_problem = _keuss_problem(cfg)
    with server() as srv:
        print(f"server: {srv.label}", file=sys.stderr)
        rows = _run(cfg, srv, keuss_problem)
    report.add_ratios(rows)
    report.add_ceilings(rows, os.cpu_count() or 1)
    out = report.RESULTS / "latest.json"
    report.write_json(rows, srv.label, out)
    print(report.table(rows, srv.label, srv.real_mongod))
    print("\nGoals (worst w:1 cell):")
    for status, goal, detail in report.goals(rows):
        print(f"  {status:<4}  {goal:<40} {detail}")
    try:
        report.chart(rows, srv.label, srv.real_mongod, report.RESULTS / "latest.png")
        chart = f" and {report.RESULTS / 'latest.png'}"
    except ImportError as exc:
        chart = f" (no chart: {exc})"
    print(f"\nwrote {out}{chart} in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bench's arithmetic: the server's CPU over a job's timed span, and the CPU ceiling the report sets
beside a missed goal."""

from __future__ import annotations

import io
import time

import pytest

from bench import fleet
from bench.plan import Job
from bench.report import add_ceilings, goals
from bench.runner import aggregate, median_round
from bench.worker import Ctx, _cpu_s


def _result(t_start: float, t_end: float, messages: int = 1000, cpu_s: float = 0.5) -> dict:
    return {"messages": messages, "t_start": t_start, "t_end": t_end, "cpu_s": cpu_s, "peak_rss_mb": 50.0,
            "commands": 3, "command_names": {"insert": 3}, "latencies_ms": [], "notes": ""}


def _row(contender: str, rate: float, client: float | None = None, server: float | None = None,
         processes: int = 1) -> dict:
    return {"contender": contender, "scenario": "push", "payload_bytes": 1024, "processes": processes,
            "write_concern": "1", "msgs_per_s": rate, "cpu_s_per_1000": client, "server_cpu_s_per_1000": server,
            "client_cores": processes}


def test_the_server_cpu_of_a_job_is_interpolated_over_its_timed_span() -> None:
    job = Job("bucketq", "push", 1024, 2, 2000)
    # Two workers timed from 10.0 to 12.0 s; the server's CPU was read at 9 s (100 s) and 13 s (104 s).
    row = aggregate(job, [_result(10.0, 11.5), _result(10.5, 12.0)], 16, [(9.0, 100.0), (13.0, 104.0)])
    assert row["msgs_per_s"] == pytest.approx(1000.0)
    assert row["server_cpu_s_per_1000"] == pytest.approx(1.0)  # 2 s of server CPU for 2,000 messages
    assert row["cpu_s_per_1000"] == pytest.approx(0.5)
    assert row["client_cores"] == 2


def test_no_server_cpu_unless_the_samples_cover_the_timed_span() -> None:
    job = Job("bucketq", "push", 1024, 1, 1000)
    assert aggregate(job, [_result(10.0, 12.0)], 16, [(10.5, 100.0), (13.0, 104.0)])["server_cpu_s_per_1000"] is None
    assert aggregate(job, [_result(10.0, 12.0)], 16, [])["server_cpu_s_per_1000"] is None


def test_the_ceiling_is_the_tighter_of_the_shared_cores_and_one_core_per_client_process() -> None:
    shared = _row("bucketq", 90_000, client=0.008, server=0.010)
    client_bound = _row("bucketq", 90_000, client=0.010, server=0.001)
    two_processes = _row("bucketq", 90_000, client=0.010, server=0.001, processes=2)
    unknown = _row("bucketq", 90_000, client=0.008)
    add_ceilings([shared, client_bound, two_processes, unknown], cores=2)
    assert shared["cpu_ceiling_msgs_per_s"] == pytest.approx(2 / 0.018 * 1000)  # 111,111: the cores
    assert client_bound["cpu_ceiling_msgs_per_s"] == pytest.approx(100_000)  # one event loop's core
    assert two_processes["cpu_ceiling_msgs_per_s"] == pytest.approx(2 / 0.011 * 1000)
    assert unknown["cpu_ceiling_msgs_per_s"] is None


def test_a_missed_goal_says_where_the_ceiling_is_and_a_met_one_says_nothing_of_it() -> None:
    rows = [_row("bucketq", 90_000, client=0.008, server=0.010), _row("keuss", 60_000)]
    add_ceilings(rows, cores=2)
    (status, _, detail), = [g for g in goals(rows) if g[1] == "bucketq push >= 2x keuss"]
    assert status == "MISS"
    assert detail == ("worst 1.50x at 1 KiB x1; CPU per msg: client 0.0080 ms + server 0.0100 ms, "
                      "ceiling 111,111/s, below the 120,000/s the goal needs")
    rows[1]["msgs_per_s"] = 40_000
    (status, _, detail), = [g for g in goals(rows) if g[1] == "bucketq push >= 2x keuss"]
    assert (status, detail) == ("PASS", "worst 2.25x at 1 KiB x1")


def test_end_to_end_latency_passes_only_below_keuss_in_every_cell() -> None:
    rows = []
    for processes, ours, theirs in ((1, 500.0, 1100.0), (2, 700.0, 650.0)):
        for contender, p50 in (("bucketq", ours), ("keuss", theirs)):
            rows.append({**_row(contender, 40_000, processes=processes), "scenario": "end_to_end", "p50_ms": p50})
    (verdict,) = [g for g in goals(rows) if g[1] == "bucketq end_to_end p50 latency < keuss's"]
    assert verdict == ("MISS", "bucketq end_to_end p50 latency < keuss's", "worst 700 vs 650 ms at 1 KiB x2")
    rows[-1]["p50_ms"] = 900.0
    (verdict,) = [g for g in goals(rows) if g[1] == "bucketq end_to_end p50 latency < keuss's"]
    assert verdict[0] == "PASS"


def _idle_goal(kinds: dict[str, int], window_s: float, scenario: str = "idle") -> tuple[str, str]:
    """The idle goal judged on one idle cell: 4 consumers (or readers) sending ``kinds`` over ``window_s``."""
    result = {**_result(0.0, window_s, messages=20_000), "idle": {"consumers": 4, "kinds": kinds, "others": {}}}
    row = aggregate(Job("bucketq", scenario, 1024, 1, 20_000), [result], 16)
    (status, _, detail), = [g for g in goals([row]) if g[1].startswith(f"bucketq {scenario} <=")]
    return status, detail


def test_the_idle_goal_counts_commands_per_consumer_minute_besides_change_streams() -> None:
    quiet = {"claims": 4, "pause_reads": 4, "next_due": 4, "getmores": 240, "other": 4}  # 4 consumers, 60 s
    status, detail = _idle_goal(quiet, 60.0)
    assert status == "PASS" and detail.startswith("4.00 (1.0 claims, 1.0 pause_reads, 1.0 next_due, 60.0 getmores")
    assert _idle_goal({**quiet, "claims": 16}, 60.0)[0] == "MISS"  # 7 a minute: over 1,000 x 0.1/s


def test_a_window_shorter_than_the_safety_poll_counts_the_polls_rate_instead_of_what_it_saw() -> None:
    status, detail = _idle_goal({"claims": 0, "pause_reads": 0, "next_due": 0, "getmores": 120, "other": 4}, 30.0)
    assert status == "PASS" and detail.startswith("2.40 (")  # 2 other + 2 commands every 300 s on average


def test_the_stream_idle_goal_counts_a_readers_safety_poll_as_one_look_at_its_group() -> None:
    status, detail = _idle_goal({"claims": 0, "getmores": 120, "other": 0}, 30.0, "stream_idle")
    assert status == "PASS" and detail.startswith("0.80 (")  # 4 commands every 300 s on average
    assert _idle_goal({"claims": 0, "getmores": 120, "other": 16}, 30.0, "stream_idle")[0] == "MISS"  # 8 a minute


def test_client_cpu_goals_judge_the_worst_1_kib_cell_against_the_floor_push_of_the_same_cell() -> None:
    rows = [_row("floor", 200_000, client=0.002), _row("floor", 300_000, client=0.002, processes=2),
            _row("bucketq", 90_000, client=0.0038), _row("bucketq", 90_000, client=0.0042, processes=2),
            {**_row("bucketq", 80_000, client=0.0030), "scenario": "push_many"},
            {**_row("bucketq", 5_000, client=0.0200), "payload_bytes": 100},  # not a 1 KiB cell: not judged
            {**_row("bucketq", 900, client=1.4), "scenario": "latency"},
            {**_row("floor", 1_000, client=0.7), "scenario": "latency"}]
    verdicts = {goal: (status, detail) for status, goal, detail in goals(rows)}
    assert verdicts["bucketq push client CPU/msg <= 2x floor push (1 KiB)"] == (
        "MISS", "worst 2.10x at 1 KiB x2 (4.20 vs 2.00 us)")
    assert verdicts["bucketq push_many client CPU/msg <= 2x floor push (1 KiB)"] == (
        "PASS", "worst 1.50x at 1 KiB x1 (3.00 vs 2.00 us)")
    assert verdicts["bucketq latency client CPU/msg vs floor latency (1 KiB)"] == (
        "info", "worst 2.00x at 1 KiB x1 (1400.00 vs 700.00 us)")
    rows[3]["cpu_s_per_1000"] = 0.0039
    push_goal = "bucketq push client CPU/msg <= 2x floor push (1 KiB)"
    assert ("PASS", push_goal, "worst 1.95x at 1 KiB x2 (3.90 vs 2.00 us)") in goals(rows)
    without_floor = [r for r in rows if r["contender"] != "floor"]
    assert ("n/a", push_goal, "nothing to compare") in goals(without_floor)


def test_consume_and_spark_cpu_goals_judge_against_the_floor_consume_and_the_naive_spark_read() -> None:
    rows = [{**_row("floor", 300_000, client=0.002), "scenario": "consume"},
            {**_row("bucketq", 40_000, client=0.0070), "scenario": "consume"},
            {**_row("bucketq", 50_000, client=0.0050), "scenario": "consume_batch"},
            {**_row("naive", 30_000, client=0.020), "scenario": "spark_read", "payload_bytes": 100},
            {**_row("bucketq", 40_000, client=0.030), "scenario": "spark_read", "payload_bytes": 100}]
    verdicts = {goal: (status, detail) for status, goal, detail in goals(rows)}
    assert verdicts["bucketq consume client CPU/msg <= 3x floor consume (1 KiB)"] == (
        "MISS", "worst 3.50x at 1 KiB x1 (7.00 vs 2.00 us)")
    assert verdicts["bucketq consume_batch client CPU/msg <= 2x floor consume (1 KiB)"] == (
        "MISS", "worst 2.50x at 1 KiB x1 (5.00 vs 2.00 us)")
    assert verdicts["bucketq spark_read client CPU/msg <= 1x naive spark_read"] == (
        "MISS", "worst 1.50x at 100 B x1 (30.00 vs 20.00 us)")
    rows[1]["cpu_s_per_1000"], rows[2]["cpu_s_per_1000"], rows[4]["cpu_s_per_1000"] = 0.0060, 0.0040, 0.020
    passed = {goal for status, goal, _ in goals(rows) if status == "PASS"}
    assert {"bucketq consume client CPU/msg <= 3x floor consume (1 KiB)",
            "bucketq consume_batch client CPU/msg <= 2x floor consume (1 KiB)",
            "bucketq spark_read client CPU/msg <= 1x naive spark_read"} <= passed


def test_cpu_goals_pair_each_round_with_the_floors_round_beside_it() -> None:
    # Rounds of one cell run in turn; the machine was slower in the later ones. The rows' own figures (those of
    # their median-throughput rounds) came from different rounds: 8.40 vs 1.60 us would MISS at 5.25x.
    floor = {**_row("floor", 300_000, client=0.0016), "scenario": "consume", "cpu_rounds": [0.0016, 0.0024, 0.0030]}
    ours = {**_row("bucketq", 90_000, client=0.0084), "scenario": "consume", "cpu_rounds": [0.0054, 0.0066, 0.0084]}
    batch = {**_row("bucketq", 90_000, client=0.0060), "scenario": "consume_batch",
             "cpu_rounds": [0.0042, 0.0060, 0.0050]}
    verdicts = {goal: (status, detail) for status, goal, detail in goals([floor, ours, batch])}
    assert verdicts["bucketq consume client CPU/msg <= 3x floor consume (1 KiB)"] == (
        "PASS", "worst 2.80x at 1 KiB x1 (median of 3 paired rounds: 3.38x, 2.75x, 2.80x; 6.60 vs 2.40 us)")
    # another cell's rounds ran minutes apart: the ratio of the two median rounds
    assert verdicts["bucketq consume_batch client CPU/msg <= 2x floor consume (1 KiB)"] == (
        "MISS", "worst 2.08x at 1 KiB x1 (median rounds, 5.00 vs 2.40 us)")


def test_push_many_and_consume_batch_pair_with_the_floors_rounds_of_their_own_cell_when_it_ran_there() -> None:
    # The floor's push and consume, run again in the push_many and consume_batch cells in turn with bucketq's
    # rounds, are what those goals pair with. Its push and consume cells ran in a slower minute: against them
    # both goals would PASS (1.20x and 1.67x).
    floor = _row("floor", 300_000, client=0.0030)
    rows = [{**floor, "cpu_rounds": [0.0030] * 3}, {**floor, "scenario": "consume", "cpu_rounds": [0.0030] * 3},
            {**floor, "scenario": "push_many", "cpu_rounds": [0.0016, 0.0016, 0.0024]},
            {**floor, "scenario": "consume_batch", "cpu_rounds": [0.0020, 0.0020, 0.0024]},
            {**_row("bucketq", 90_000, client=0.0036), "scenario": "push_many", "cpu_rounds": [0.0036, 0.0036, 0.0060]},
            {**_row("bucketq", 90_000, client=0.0050), "scenario": "consume_batch",
             "cpu_rounds": [0.0036, 0.0050, 0.0054]}]
    verdicts = {goal: (status, detail) for status, goal, detail in goals(rows)}
    assert verdicts["bucketq push_many client CPU/msg <= 2x floor push (1 KiB)"] == (
        "MISS", "worst 2.25x at 1 KiB x1 (median of 3 paired rounds: 2.25x, 2.25x, 2.50x; 3.60 vs 1.60 us)")
    assert verdicts["bucketq consume_batch client CPU/msg <= 2x floor consume (1 KiB)"] == (
        "MISS", "worst 2.25x at 1 KiB x1 (median of 3 paired rounds: 1.80x, 2.50x, 2.25x; 5.00 vs 2.00 us)")


def test_the_median_round_keeps_each_rounds_client_cpu_in_the_order_they_ran() -> None:
    rounds = [{**_row("bucketq", rate, client=cpu)} for rate, cpu in ((90_000, 0.005), (60_000, 0.007),
                                                                       (120_000, 0.004))]
    row = median_round(rounds)
    assert row["msgs_per_s"] == 90_000 and row["cpu_s_per_1000"] == 0.005
    assert row["cpu_rounds"] == [0.005, 0.007, 0.004]
    assert median_round(rounds[:1])["cpu_rounds"] == [0.005]


def test_a_clock_stopped_at_the_last_mark_counts_the_cpu_spent_up_to_it_and_not_the_idle_wait_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = Ctx({})
    monkeypatch.setattr(ctx, "emit", lambda obj: None)
    monkeypatch.setattr("sys.stdin", io.StringIO("go\n"))
    ctx.go()
    started = _cpu_s()
    while _cpu_s() - started < 0.375:  # busy, as a consumer is until its last ack
        ctx.mark_in_loop()
    spent = _cpu_s() - started
    time.sleep(0.6)  # idle, as a consumer is while it waits for more
    ctx.stop(at_last_mark=True)
    # With a CPU reading only every progress tick (0.25 s), the CPU between the last reading and the last mark was
    # interpolated over the time to the next reading, idle: here 0.31 of 0.375 s counted.
    assert ctx.result()["cpu_s"] == pytest.approx(spent, abs=0.03)  # a reading every 10 ms: within 0.015 s


def test_the_fleet_goals_judge_each_shape_and_compare_wake_ups_with_the_lone_consumer() -> None:
    def row(rate: float, streams: int, first: float) -> dict:
        return {"non_getmore_per_s_per_1000": rate, "consumers": 100, "processes": 2, "queues_per_process": 50,
                "window_s": 190.0, "change_streams_per_process": streams, "first_wakeup_s": first,
                "claims_per_bucket": 2.0, "consumers_woken": 4, "burst_buckets": 4}

    verdicts = {goal: status for status, goal, _ in fleet.goals(
        {"single": row(0.0, 2, 0.4), "many": row(14.0, 2, 0.5), "one": row(25.0, 2, 1.0)})}
    assert verdicts == {
        "fleet many: <= 20 cmds/s besides getMores per 1,000 idle consumers": "PASS",
        "fleet one: <= 20 cmds/s besides getMores per 1,000 idle consumers": "MISS",
        "fleet many: change streams per process, not per queue": "PASS",
        "fleet many: burst's first wake-up no later than a lone consumer's": "PASS",  # within 1.5x + 0.1 s
        "fleet one: burst's first wake-up no later than a lone consumer's": "MISS"}
    many_streams = fleet.goals({"many": row(1.0, 100, 0.5)})
    assert ("MISS", "fleet many: change streams per process, not per queue") in [(s, g) for s, g, _ in many_streams]

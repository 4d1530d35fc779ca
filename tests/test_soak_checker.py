"""The soak checker and trends over synthetic histories: a clean history passes every rule with cases checked, and
each defect planted in it fails its rule with the records that show it (tests/soak/checker.py, trends.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import examples
from tests.soak import trends
from tests.soak.checker import RULES, check, check_records, main

pytestmark = pytest.mark.unit

T0 = 1_780_000_000_000.0  # the server's clock, ms


def rec(at: float, proc: str, op: str, **fields: Any) -> dict[str, Any]:
    """A history record ``at`` ms into the run, its clock known within 1 ms."""
    return {"at": T0 + at, "err": 1.0, "proc": proc, "op": op, **fields}


def handled(at: float, proc: str, mid: str, queue: str = "soak", **fields: Any) -> list[dict[str, Any]]:
    """A message started, acked and ended by ``proc`` over 60 ms from ``at``."""
    return [rec(at, proc, "start", queue=queue, id=mid, attempt=1, **fields),
            rec(at + 50, proc, "ack", queue=queue, id=mid),
            rec(at + 60, proc, "end", queue=queue, id=mid)]


def tick(at: float, proc: str = "sched-1.g1") -> dict[str, Any]:
    """The tick due at ``at`` fired then."""
    return rec(at, proc, "tick", schedule="every-sec", tick_at=T0 + at)


P, W1, W2, W3, READER = "producer-1.g1", "worker-1.g1", "worker-2.g1", "worker-3.g1", "reader-1.g1"
CLEAN: list[dict[str, Any]] = [
    rec(0, "runner", "config", queue="soak", rate_limit=None, unique_for_s=60.0, tolerance={}),
    rec(0, "runner", "config", queue="rated", rate_limit={"count": 3, "per_s": 1.0}, unique_for_s=None,
        tolerance={}),
    rec(10, "sched-1.g1", "schedule_config", schedule="every-sec", every_ms=1000.0, first_at=T0 + 1000),
    rec(100, P, "push_ok", queue="soak", id="m1", kind="plain"),
    rec(110, P, "push_ok", queue="soak", id="m2", kind="group", group="g1", seq=0),
    rec(120, P, "push_ok", queue="soak", id="m3", kind="group", group="g1", seq=1),
    rec(130, P, "push_ok", queue="soak", id="m4", kind="unique", unique_key="u1"),
    *[rec(140 + i, P, "push_ok", queue="rated", id=f"m{5 + i}", kind="rate") for i in range(4)],
    rec(180, P, "push_ok", queue="soak", id="m9", kind="delayed", due=T0 + 500),
    *[rec(190 + i, P, "push_ok", queue="events", id=f"s{i}", kind="stream", partition=0, position=i)
      for i in range(3)],
    rec(200, "canceller-1.g1", "cancel_ok", queue="soak", id="m9", outcome="cancelled"),
    *handled(300, W1, "m1"),
    *handled(400, W1, "m2", group="g1", seq=0),
    *handled(500, W2, "m3", group="g1", seq=1),
    *handled(600, W1, "m4"),
    rec(700, W1, "flushed", queue="soak", ids=["m1", "m2", "m4"]),
    rec(710, W2, "flushed", queue="soak", ids=["m3"]),
    rec(800, P, "push_ok", queue="soak", id="m10", kind="unique", unique_key="u1"),  # u1's first job is done
    *handled(900, W1, "m10"),
    rec(970, W1, "flushed", queue="soak", ids=["m10"]),
    tick(1000),
    *[r for i in range(4) for r in handled(1100 + 100 * i, W3, f"m{5 + i}", queue="rated")],
    rec(1500, W3, "flushed", queue="rated", ids=["m5", "m6", "m7", "m8"]),
    *[rec(1600 + 10 * i, READER, "read", stream="events", reader_group="audit", partition=0, position=i, id=f"s{i}")
      for i in range(3)],
    rec(1700, READER, "commit_pos", stream="events", reader_group="audit", partition=0, position=3),
    tick(2000),
    tick(3000),
    tick(4000),
]


def planted(*extra: dict[str, Any], without: tuple[tuple[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """The clean history with ``extra`` records added and those whose (op, id or tick_at or position) is in
    ``without`` taken out."""
    def name(r: dict[str, Any]) -> tuple[str, Any]:
        return r["op"], r.get("id", r.get("tick_at"))

    return [r for r in copy.deepcopy(CLEAN) if name(r) not in without] + list(extra)


def failing(records: list[dict[str, Any]], rule: str) -> list[tuple[set[str], list[str]]]:
    """The violations of ``rule`` (ids, evidence ops); every other rule must still pass."""
    verdict = check_records(records)
    assert not verdict.passed
    assert [r.name for r in verdict.rules if not r.passed] == [rule], verdict.to_json()
    return [(set(v.ids), [e.op for e in v.evidence]) for v in verdict.rule(rule).violations]


def test_a_clean_history_passes_every_rule_with_cases_checked() -> None:
    verdict = check_records(CLEAN)
    assert verdict.passed, verdict.to_json()
    assert [r.name for r in verdict.rules] == [rule.__name__ for rule in RULES]
    assert all(r.cases > 0 for r in verdict.rules), {r.name: r.cases for r in verdict.rules}


@st.composite
def served(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Messages pushed by two producers and served by three workers, interleaved any way that keeps each message's
    own order (push, start, ack, end, flush) and each group's (one at a time, in seq order, 5 ms apart), each
    record's clock known within up to 2 ms."""
    records, group_free_at, seqs = [CLEAN[0]], {"g1": 0.0, "g2": 0.0}, {"g1": 0, "g2": 0}
    for i in range(draw(st.integers(1, 12))):
        producer = draw(st.sampled_from(["producer-1.g1", "producer-2.g1"]))
        worker = draw(st.sampled_from([W1, W2, W3]))
        group = draw(st.sampled_from([None, "g1", "g2"]))
        pushed, run = draw(st.floats(0, 1000)), draw(st.floats(5, 200))
        start, fields = pushed + draw(st.floats(5, 500)), {}
        if group is not None:  # after the group's previous message ended
            start = max(start, group_free_at[group] + 5)
            fields = {"group": group, "seq": seqs[group]}
            group_free_at[group], seqs[group] = start + run, seqs[group] + 1
        mid = f"m{i}"
        records += [rec(pushed, producer, "push_ok", queue="soak", id=mid, kind="plain" if group is None else "group",
                        **fields),
                    rec(start, worker, "start", queue="soak", id=mid, attempt=1),
                    rec(start + run - 1, worker, "ack", queue="soak", id=mid),
                    rec(start + run, worker, "end", queue="soak", id=mid),
                    rec(start + run + draw(st.floats(1, 100)), worker, "flushed", queue="soak", ids=[mid])]
    return [{**r, "err": draw(st.floats(0, 2))} for r in records]


@settings(max_examples=examples(30), deadline=None)  # no deadline: a loaded machine must not fail it
@given(served())
def test_any_interleaving_of_processes_serving_messages_in_order_breaks_no_rule(records: list[dict[str, Any]]
                                                                                ) -> None:
    verdict = check_records(records)
    assert not [v for r in verdict.rules for v in r.violations]
    pushes = sum(r["op"] == "push_ok" for r in records)
    assert verdict.rule("lost").cases == verdict.rule("redelivered_after_flushed_ack").cases == pushes


def test_a_lost_push_fails_lost() -> None:
    lost = rec(150, P, "push_ok", queue="soak", id="m12", kind="plain")
    assert failing(planted(lost), "lost") == [({"m12"}, ["push_ok"])]


def test_a_push_dead_lettered_or_still_due_at_the_end_is_not_lost() -> None:
    dead = [rec(150, P, "push_ok", queue="soak", id="m12", kind="plain"),
            rec(300, W1, "dead", queue="soak", id="m12", reason="max_attempts")]
    due_later = rec(160, P, "push_ok", queue="soak", id="m13", kind="delayed", due=T0 + 10_000)
    assert check_records(planted(*dead, due_later)).passed


def test_an_outbox_event_is_run_by_a_start_of_its_key() -> None:
    event = rec(150, P, "push_ok", queue="soak", id="order-1", kind="outbox", key="order-1")
    relayed = rec(300, W2, "start", queue="soak", id="m99", attempt=1, key="order-1")
    assert check_records(planted(event, relayed)).passed
    assert failing(planted(event), "lost") == [({"order-1"}, ["push_ok"])]


def test_an_ack_applied_twice_is_a_redelivery_after_its_flush() -> None:
    again = rec(1800, W2, "start", queue="soak", id="m1", attempt=2)
    assert failing(planted(again), "redelivered_after_flushed_ack") == [({"m1"}, ["flushed", "start"])]


def test_a_redelivery_of_an_ack_not_yet_flushed_is_allowed() -> None:
    # worker-1 flushed m1 at 700: a start within the flush's error bounds is not surely after it
    again = rec(701, W2, "start", queue="soak", id="m1", attempt=2)
    assert check_records(planted(again)).passed


def test_a_group_served_by_two_consumers_at_once_fails_ordered_group() -> None:
    overlapping = handled(430, W2, "m3", group="g1", seq=1)  # m2 runs on worker-1 from 400 to 460
    records = planted(*overlapping, without=(("start", "m3"), ("ack", "m3"), ("end", "m3")))
    assert failing(records, "ordered_group") == [({"m2", "m3"}, ["start", "end", "start", "end"])]


def test_a_group_first_delivered_out_of_seq_order_fails_ordered_group() -> None:
    late_seq_0 = handled(600, W2, "m2", group="g1", seq=0)  # seq 1 started at 500
    records = planted(*late_seq_0, without=(("start", "m2"), ("ack", "m2"), ("end", "m2")))
    assert failing(records, "ordered_group") == [({"m3", "m2"}, ["start", "start"])]


def test_a_group_delivered_again_from_an_unflushed_ack_after_a_crash_keeps_its_order() -> None:
    # worker-2 was killed running seq 1 before its flush: seq 0 (acked, not flushed) and seq 1 come again in order
    records = planted(rec(530, "runner", "killed", target=W2), *handled(600, W3, "m2", group="g1", seq=0),
                      *handled(700, W3, "m3", group="g1", seq=1), without=(("end", "m3"), ("flushed", "m3")))
    assert check_records(records).rule("ordered_group").passed


def test_a_handler_that_outlived_its_lease_may_overlap_the_next_of_its_group() -> None:
    overlapping = handled(430, W2, "m3", group="g1", seq=1)
    records = planted(*overlapping, without=(("start", "m3"), ("ack", "m3"), ("end", "m3"), ("end", "m2")))
    records.append(rec(460, W1, "end", queue="soak", id="m2", lease_lost=True))
    assert check_records(records).rule("ordered_group").passed


def test_a_run_whose_process_was_killed_ends_at_the_kill() -> None:
    # m2's handler never reports its end: worker-1 was killed at 450, so m3 may start at 500
    records = planted(rec(450, "runner", "killed", target=W1), without=(("end", "m2"),))
    assert check_records(records).passed


def test_a_unique_key_released_early_fails_unique() -> None:
    early = [rec(610, "observer.g1", "unique_released", queue="soak", unique_key="u1", id="m4"),
             rec(620, P, "push_ok", queue="soak", id="m11", kind="unique", unique_key="u1")]
    records = planted(*early, *handled(700, W2, "m11"))
    assert failing(records, "unique") == [({"m4", "m11"}, ["push_ok", "push_ok"]),
                                          ({"m4"}, ["push_ok", "unique_released"])]


def test_a_cancelled_message_run_fails_cancel() -> None:
    run = rec(1200, W1, "start", queue="soak", id="m9", attempt=1)
    assert failing(planted(run), "cancel") == [({"m9"}, ["cancel_ok", "start"])]


def test_a_requested_cancel_lets_the_consumer_hand_out_or_nack_the_message_until_it_heard() -> None:
    push = rec(150, P, "push_ok", queue="soak", id="m20", kind="plain")
    first = rec(300, W2, "start", queue="soak", id="m20", attempt=1)
    request = rec(320, "canceller-1.g1", "cancel_ok", queue="soak", id="m20", outcome="requested")
    nacked = rec(340, W2, "nack", queue="soak", id="m20", reason="boom")
    handed_before_it_heard = rec(5000, W2, "start", queue="soak", id="m20", attempt=2)
    retry = rec(16_000, W2, "start", queue="soak", id="m20", attempt=2)  # cancel_notice_ms is 15 s
    assert check_records(planted(push, first, request, nacked, retry)).passed
    assert check_records(planted(push, request, handed_before_it_heard)).passed
    assert failing(planted(push, first, request, retry), "cancel") == [({"m20"}, ["cancel_ok", "start"])]


def test_a_tick_fired_twice_fails_schedule() -> None:
    twice = tick(2000, proc="sched-2.g1")
    assert failing(planted(twice), "schedule") == [({f"every-sec@{T0 + 2000}"}, ["tick", "tick"])]


def test_a_tick_skipped_while_a_scheduler_was_alive_fails_schedule() -> None:
    records = planted(without=(("tick", T0 + 2000),))
    assert failing(records, "schedule") == [({f"every-sec@{T0 + 2000}"}, ["tick", "tick"])]


@pytest.mark.parametrize("why", [
    [rec(1500, "runner", "killed", target="sched-1.g1")],  # no scheduler alive
    [rec(1900, "runner", "fault", kind="server_stall", ms=1500.0)],  # none could reach the server
    [rec(20, "sched-2.g1", "schedule_config", schedule="every-sec", every_ms=1000.0, first_at=T0 + 1000),
     rec(2010, "runner", "killed", target="sched-1.g1")],  # killed after it fired, before it wrote it down
], ids=["no-scheduler", "outage", "killed-while-firing"])
def test_a_tick_missing_while_no_scheduler_could_fire_or_write_it_down_is_excused(why: list[dict[str, Any]]
                                                                                   ) -> None:
    records = planted(*why, tick(3000, proc="sched-2.g1"), without=(("tick", T0 + 2000), ("tick", T0 + 3000)))
    assert check_records(records).rule("schedule").passed


def test_a_position_skipped_fails_reader_group() -> None:
    records = planted(without=(("read", "s1"),))
    assert failing(records, "reader_group") == [({"s1"}, ["push_ok", "commit_pos"])]


def test_a_position_read_again_behind_the_commit_fails_reader_group() -> None:
    behind = rec(1800, "reader-2.g1", "read", stream="events", reader_group="audit", partition=0, position=1,
                 id="s1")
    assert failing(planted(behind), "reader_group") == [({"s1"}, ["commit_pos", "read"])]


def test_an_uncommitted_position_read_again_after_a_crash_is_allowed() -> None:
    again = [rec(1650, "runner", "killed", target=READER),
             rec(1660, "reader-2.g1", "read", stream="events", reader_group="audit", partition=0, position=2,
                 id="s2")]
    assert check_records(planted(*again)).passed


def test_a_rate_window_over_the_limit_fails_rate_limit() -> None:
    # 4 starts from 1100 to 1400 already; 4 more by 1440 make 8 within one second: 3 allowed, plus 3 for a span
    # that straddles two windows
    more = [rec(1410 + 10 * i, W2, "start", queue="rated", id=f"r{i}", attempt=1) for i in range(4)]
    [(ids, ops)] = failing(planted(*more), "rate_limit")
    assert ids == {"m5", "m6", "m7", "m8", "r0", "r1", "r2", "r3"} and ops == ["start"] * 8


def test_a_rule_with_no_cases_fails_the_verdict() -> None:
    verdict = check_records(planted(without=tuple(("tick", T0 + at) for at in (1000, 2000, 3000, 4000))))
    schedule = verdict.rule("schedule")
    assert schedule.cases == 0 and not schedule.violations and not schedule.passed and not verdict.passed
    assert not check_records([CLEAN[0]]).passed


def test_a_run_dir_is_read_per_process_file_and_a_line_cut_by_a_kill_is_left_out(tmp_path: Path,
                                                                                  capsys: pytest.CaptureFixture[str]
                                                                                  ) -> None:
    (tmp_path / "history").mkdir()
    for proc in {r["proc"] for r in CLEAN}:
        lines = [json.dumps(r) for r in CLEAN if r["proc"] == proc]
        (tmp_path / "history" / f"{proc}.jsonl").write_text("\n".join(lines) + '\n{"at": 17')
    assert check(tmp_path).passed
    assert main([str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True
    with pytest.raises(FileNotFoundError):
        check(tmp_path / "history")


def samples(proc: str, metric: str, values: list[float]) -> list[dict[str, Any]]:
    """One resource sample of ``metric`` per value, five seconds apart."""
    return [{"at": T0 + 5000 * i, "proc": proc, "metric": metric, "value": v} for i, v in enumerate(values)]


def test_a_flat_series_does_not_grow_a_growing_one_does_and_the_oplog_is_not_judged() -> None:
    flat = samples("worker-1.g1", "rss_bytes", [200e6 + (i % 3) * 1e6 for i in range(40)])
    leak = samples("worker-2.g1", "rss_bytes", [200e6 + i * 5e6 for i in range(40)])
    oplog = [{"at": s["at"], "server": "test", "metric": s["metric"], "value": s["value"]}
             for s in samples("", "server.oplog.entries", [1000.0 * i for i in range(40)])]
    found = {(t.proc, t.metric): t for t in trends.trends(flat + leak + oplog)}
    assert found[("worker-1.g1", "rss_bytes")].judged and not found[("worker-1.g1", "rss_bytes")].grows
    assert found[("worker-2.g1", "rss_bytes")].grows
    assert not found[("test", "server.oplog.entries")].judged
    assert trends.growing(found.values()) == [found[("worker-2.g1", "rss_bytes")]]


def test_document_counts_are_judged_from_when_their_retention_has_passed_and_not_in_a_run_too_short_for_it() -> None:
    # 40 samples 5 s apart: tombstones pile up for their first 100 s (kept a while, then swept), then level off
    tombstones = [1000.0 * min(i, 20) for i in range(40)]
    [settled] = trends.trends(samples("server", "docs.jobs.tombstones", tombstones), settle_s=100)
    assert settled.judged and not settled.grows and settled.second_quarter == 20000
    [unsettled] = trends.trends(samples("server", "docs.jobs.tombstones", tombstones))
    assert unsettled.grows  # compared from the second quarter, the pile-up looks like a leak
    [leak] = trends.trends(samples("server", "docs.jobs.tombstones", [1000.0 * i for i in range(40)]), settle_s=100)
    assert leak.grows
    [short] = trends.trends(samples("server", "docs.jobs.tombstones", tombstones), settle_s=150)
    assert not short.judged  # no quarter between the settling and the last quarter
    [rss] = trends.trends(samples("worker-1.g1", "rss_mb", [100.0] * 40), settle_s=150)
    assert rss.judged  # the settling is the document counts' only


@pytest.mark.parametrize(("metric", "before", "after", "grows"), [
    ("tasks", 10.0, 20.0, False),  # doubled, but within the 50 tasks a busy process may gain
    ("tasks", 10.0, 70.0, True),
    ("rss_mb", 100.0, 125.0, False),  # 25%, but within 32 MB
    ("rss_mb", 100.0, 140.0, True),
    ("docs.jobs.tombstones", 100.0, 900.0, False),  # within 1,000 documents
    ("open_files", 10.0, 13.0, True),  # no floor of its own: 1
])
def test_growth_counts_beyond_the_margin_and_the_floor_of_its_kind_of_metric(metric: str, before: float,
                                                                             after: float, grows: bool) -> None:
    [found] = trends.trends(samples("worker-1.g1", metric, [before] * 20 + [after] * 20))
    assert found.judged and found.grows is grows

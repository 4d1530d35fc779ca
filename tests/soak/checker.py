"""The soak checker: rules over a run's whole history, in the manner of Jepsen (``check(run_dir) -> Verdict``,
``python -m tests.soak.checker <run>``, which prints the verdict as JSON and exits 1 unless it passed).

The history is the records of every process of the run (``<run>/history/*.jsonl``, the format in the module
``tests.soak``'s runner writes). Each record's ``at`` is the server's clock as its process estimates it, known only
within ``err``: a record is *surely before* another when ``a.at + a.err < b.at - b.err``, and a rule counts a
violation only on what is surely so. Each rule says how many cases it checked; a rule that checked none fails
(a run that never exercised it proves nothing), and so does any violation, which names the rule, the message
ids and the records that show it (proc, op, at).

The runner writes a ``config`` record per queue (its ``rate_limit`` and ``unique_for_s``); what the rules allow
beyond the documented guarantees is in ``DEFAULT_TOLERANCE``, which any ``config`` record may override under
``tolerance``.
"""

from __future__ import annotations

import bisect
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Record = dict[str, Any]

DEFAULT_TOLERANCE: dict[str, Any] = {
    # Starts of the rate-limited queue allowed beyond ``count`` in any span of ``per_s``; None means ``count``:
    # windows are fixed spans of the server's clock, so "a span of per seconds that straddles two windows can see
    # up to 2 * limit" (docs/guide/rate-limits.md, Bounds).
    "rate_extra": None,
    # Pushes acknowledged (or due) this close to the end of the history are not judged lost: the run may have
    # stopped before serving them. 0: the runner drains before it stops.
    "end_grace_ms": 0.0,
    # The longest a push takes from its unique key's insert to its acknowledgement (the key's ``until`` counts
    # from the insert, which the history does not show).
    "unique_push_ms": 30_000.0,
    # How long a consumer may take to hear of a cancel request on a bucket it holds ("within about lease / 2",
    # docs/guide/cancellation.md; the default lease is 30 s): a message nacked before then keeps its retry.
    "cancel_notice_ms": 15_000.0,
    # How late a live scheduler may fire a tick before the next one is due and "skip" gives up the first.
    "schedule_slack_ms": 0.0,
    # Faults during which no scheduler can fire (the server gone or stopped), and their length when the fault
    # record gives none (``ms``): a tick missed in one is the documented "skip", not a defect.
    "outage_faults": ["server_stall", "server_restart"],
    "outage_ms": 60_000.0,
}


@dataclass(frozen=True)
class Evidence:
    """One record that shows a violation: which process wrote what, when."""

    proc: str
    op: str
    at: float

    @classmethod
    def of(cls, record: Record) -> Evidence:
        """The evidence a history record gives."""
        return cls(str(record.get("proc", "?")), str(record.get("op", "?")), float(record.get("at", 0.0)))


@dataclass(frozen=True)
class Violation:
    """A case a rule found broken: the rule, the message ids (or keys, ticks, positions) and the records."""

    rule: str
    ids: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    why: str

    def to_json(self) -> dict[str, Any]:
        """The violation as JSON."""
        return {"rule": self.rule, "ids": list(self.ids), "why": self.why,
                "evidence": [vars(e) for e in self.evidence]}


@dataclass
class RuleResult:
    """A rule's outcome: how many cases it checked and what it found broken."""

    name: str
    cases: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Some case checked, none broken."""
        return self.cases > 0 and not self.violations

    def violation(self, ids: Iterable[Any], why: str, *records: Record) -> None:
        """Record a violation shown by ``records``."""
        self.violations.append(Violation(self.name, tuple(str(i) for i in ids),
                                         tuple(Evidence.of(r) for r in records), why))

    def to_json(self) -> dict[str, Any]:
        """The outcome as JSON."""
        return {"name": self.name, "cases": self.cases, "passed": self.passed,
                "violations": [v.to_json() for v in self.violations]}


@dataclass
class Verdict:
    """Every rule's outcome; the run passes only if every rule does."""

    rules: list[RuleResult]

    @property
    def passed(self) -> bool:
        """Every rule checked some case and found none broken."""
        return all(r.passed for r in self.rules)

    def rule(self, name: str) -> RuleResult:
        """The outcome of the rule ``name``."""
        return next(r for r in self.rules if r.name == name)

    def to_json(self) -> dict[str, Any]:
        """The verdict as JSON."""
        return {"passed": self.passed, "rules": [r.to_json() for r in self.rules]}


class History:
    """A run's records in the order of their ``at``, indexed by op, with the configuration of each queue."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = sorted(records, key=lambda r: r["at"])
        self.by_op: dict[str, list[Record]] = defaultdict(list)
        self.first_at: dict[str, float] = {}
        for record in self.records:
            self.by_op[record["op"]].append(record)
            self.first_at.setdefault(record["proc"], record["at"])
        self.configs = {r["queue"]: r for r in reversed(self.of("config"))}  # the first of a queue counts
        self.tolerance = dict(DEFAULT_TOLERANCE)
        for config in self.configs.values():
            self.tolerance.update(config.get("tolerance", {}))
        self.end = self.records[-1]["at"] if self.records else 0.0
        self.killed = {r["target"]: r for r in self.of("killed")}

    def of(self, op: str) -> list[Record]:
        """The records of ``op``, by ``at``."""
        return self.by_op.get(op, [])

    def unique_for_ms(self, queue: str) -> float:
        """How long a unique job of ``queue`` holds its key at most (0 when the queue has no ``unique_for_s``)."""
        return float(self.configs.get(queue, {}).get("unique_for_s") or 0.0) * 1000

    def per_id(self, op: str) -> dict[str, list[Record]]:
        """The records of ``op`` per message id, by ``at``."""
        found: dict[str, list[Record]] = defaultdict(list)
        for record in self.of(op):
            found[record["id"]].append(record)
        return found

    def alive_until(self, proc: str) -> Record:
        """The record that ends what ``proc`` could do: its kill, else the history's last record."""
        return self.killed.get(proc, self.records[-1])


def surely_before(a: Record, b: Record) -> bool:
    """Whether ``a`` happened before ``b`` whatever the error of either clock reading."""
    return bool(a["at"] + a["err"] < b["at"] - b["err"])


def lost(h: History) -> RuleResult:
    """An acknowledged push (``push_ok``) is run: some ``start`` of its id follows, unless it was cancelled
    (``cancel_ok`` not answered ``not_found``) or dead-lettered. A unique push may be merged into a job whose
    producer was killed between the key and its bucket ("pushes of it are merged into nothing until until",
    docs/guide/unique-jobs.md): excused when a process was killed within ``unique_for`` before it. Stream pushes
    are read, not run: the reader group rule checks them. A push that carries a ``key`` (an outbox event, whose
    message id only the relay knows) is also run by a ``start`` of that ``key``."""
    result = RuleResult("lost")
    started, dead = h.per_id("start"), h.per_id("dead")
    started_keys = {r["key"] for r in h.of("start") if r.get("key") is not None}
    cancelled = {r["id"] for r in h.of("cancel_ok") if r.get("outcome") != "not_found"}
    kills = h.of("killed")
    seen: set[str] = set()
    for push in h.of("push_ok"):
        mid = push["id"]
        if push["kind"] == "stream" or mid in seen:
            continue
        seen.add(mid)
        if max(push["at"], push.get("due", 0.0)) > h.end - h.tolerance["end_grace_ms"]:
            continue
        result.cases += 1
        if mid in started or mid in dead or mid in cancelled or push.get("key", mid) in started_keys:
            continue
        if push["kind"] == "unique" and any(0 <= push["at"] - k["at"] <= h.unique_for_ms(push["queue"])
                                            for k in kills):
            continue
        result.violation([mid], "acknowledged push never started, cancelled or dead-lettered", push)
    return result


def redelivered_after_flushed_ack(h: History) -> RuleResult:
    """No ``start`` of a message surely after its ack was flushed: "An acknowledged message is not delivered again
    once its ack is flushed" (docs/guarantees.md); an ack not yet flushed may come back ("a consumer killed before
    its flush leaves those acks unwritten, and their messages come back after the lease with tries + 1")."""
    result = RuleResult("redelivered_after_flushed_ack")
    flushed: dict[str, Record] = {}
    for record in h.of("flushed"):
        for mid in record["ids"]:
            flushed.setdefault(mid, record)
    for start in h.of("start"):
        flush = flushed.get(start["id"])
        if flush is None:
            continue
        result.cases += 1
        if surely_before(flush, start):
            result.violation([start["id"]], "started again after its ack was flushed", flush, start)
    return result


@dataclass
class _Run:
    """One handler run of a message: its start and the record that ends it (its ``end``, else its process's
    kill or the history's end)."""

    start: Record
    end: Record

    def surely_overlaps(self, other: _Run) -> bool:
        """Whether both surely ran at one time."""
        return surely_before(self.start, other.end) and surely_before(other.start, self.end)


def _ends(h: History) -> dict[tuple[str, str], list[Record]]:
    """The ``end`` records per (process, message id), by ``at``."""
    ends: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in h.of("end"):
        ends[(record["proc"], record["id"])].append(record)
    return ends


def _runs(h: History, starts: list[Record], ends: dict[tuple[str, str], list[Record]]) -> list[_Run]:
    """The handler runs of ``starts``: each ends at the first ``end`` of its id by its process after it."""
    runs = []
    for start in starts:
        later = [e for e in ends.get((start["proc"], start["id"]), []) if e["at"] >= start["at"]]
        runs.append(_Run(start, later[0] if later else h.alive_until(start["proc"])))
    return runs


def ordered_group(h: History) -> RuleResult:
    """Within a group, messages are first delivered in ``seq`` order and run one at a time: "a group is delivered
    in push order, one message at a time" (docs/guarantees.md, Ordered groups). After a crash "the group resumes,
    once the lease expires, from its first message whose ack was not yet stored, so messages can be delivered
    again, in order, but never overtaken" (docs/guide/ordered-groups.md): so only a message's first start is
    held to the order, which it breaks when the first start of a higher seq of its group was surely before it.
    Two runs of different messages of a group overlap when each surely started before the other ended; a run
    whose ``end`` says ``"lease_lost": true`` (its handler outlived its lease: the group resumed without it) is
    left out of that."""
    result = RuleResult("ordered_group")
    pushed = {r["id"]: r for r in h.of("push_ok") if r.get("group") is not None}
    groups: dict[str, list[tuple[int, Record]]] = defaultdict(list)
    for start in h.of("start"):
        origin = start if start.get("group") is not None else pushed.get(start["id"])
        if origin is not None:
            groups[origin["group"]].append((origin["seq"], start))
    ends = _ends(h)
    for group, starts in groups.items():
        result.cases += len(starts)
        firsts: dict[str, tuple[int, Record]] = {}
        for seq, start in starts:
            firsts.setdefault(start["id"], (seq, start))
        _check_group_order(result, group, list(firsts.values()))
        runs = _runs(h, [s for _, s in starts], ends)
        _check_group_overlap(result, group, [r for r in runs if not r.end.get("lease_lost")])
    return result


def _check_group_order(result: RuleResult, group: str, starts: list[tuple[int, Record]]) -> None:
    """A first start after a surely earlier first start of a higher seq breaks the order."""
    by_upper = sorted(starts, key=lambda s: s[1]["at"] + s[1]["err"])
    highest: tuple[int, Record] | None = None
    i = 0
    for seq, start in sorted(starts, key=lambda s: s[1]["at"] - s[1]["err"]):
        while i < len(by_upper) and surely_before(by_upper[i][1], start):
            if highest is None or by_upper[i][0] > highest[0]:
                highest = by_upper[i]
            i += 1
        if highest is not None and highest[0] > seq:
            result.violation([highest[1]["id"], start["id"]],
                             f"group {group}: seq {seq} started after seq {highest[0]}", highest[1], start)


def _check_group_overlap(result: RuleResult, group: str, runs: list[_Run]) -> None:
    """Two messages of the group surely running at once."""
    active: list[_Run] = []
    for run in sorted(runs, key=lambda r: r.start["at"] - r.start["err"]):
        active = [a for a in active if not surely_before(a.end, run.start)]
        for other in active:
            if other.start["id"] != run.start["id"] and other.surely_overlaps(run):
                result.violation([other.start["id"], run.start["id"]], f"group {group}: two messages ran at once",
                                 other.start, other.end, run.start, run.end)
        active.append(run)


def unique(h: History) -> RuleResult:
    """One job per unique key while pending or in flight (docs/guide/unique-jobs.md): a job holds its key from
    its key's insert (at most ``unique_push_ms`` before its first ``push_ok``) until it finishes (its first
    ``ack``, ``dead`` or ``cancel_ok``: the key is deleted after the finish is written) or ``unique_for`` has
    passed. Two jobs (ids) of a key whose holds surely overlap break it, and so does a ``unique_released`` surely
    before the job could have let the key go. Each unique push is a case."""
    result = RuleResult("unique")
    slack = h.tolerance["unique_push_ms"]
    finished: dict[str, Record] = {}
    for op in ("ack", "dead", "cancel_ok"):
        for record in h.of(op):
            if record.get("outcome") != "not_found" and (
                    record["id"] not in finished or record["at"] < finished[record["id"]]["at"]):
                finished[record["id"]] = record
    jobs: dict[str, dict[str, Record]] = defaultdict(dict)  # key -> id -> first push_ok
    for push in h.of("push_ok"):
        if push.get("unique_key") is not None:
            result.cases += 1
            jobs[push["unique_key"]].setdefault(push["id"], push)

    def held_until(push: Record) -> float:
        """The earliest the job's key may have been let go."""
        expiry = push["at"] - push["err"] - slack + h.unique_for_ms(push["queue"])
        finish = finished.get(push["id"])
        return float(min(expiry, finish["at"] - finish["err"]) if finish else expiry)

    for key, firsts in jobs.items():
        holding: list[tuple[float, Record]] = []  # the earlier jobs that may still hold the key
        for later in sorted(firsts.values(), key=lambda p: p["at"] + p["err"]):
            created_by = later["at"] + later["err"]
            holding = [(until, earlier) for until, earlier in holding if until > created_by]
            for until, earlier in holding:
                if created_by < min(until, held_until(later)):
                    result.violation([earlier["id"], later["id"]], f"key {key}: two jobs pending at once",
                                     earlier, later)
            holding.append((held_until(later), later))
    for release in h.of("unique_released"):
        job = jobs.get(release["unique_key"], {}).get(release["id"])
        if job is not None and release["at"] + release["err"] < held_until(job):
            result.violation([release["id"]], f"key {release['unique_key']}: released before its job finished",
                             job, release)
    return result


def cancel(h: History) -> RuleResult:
    """No ``start`` of a message surely after its ``cancel_ok`` (a start before it is fine): "it is not delivered
    (again) and not retried" (docs/guide/cancellation.md). A cancel answered ``requested`` reaches the consumer
    holding the message "within about lease / 2" (``cancel_notice_ms``): until then it may still hand the message
    out, and a message it nacked by then keeps its retry. One answered ``not_found`` cancelled nothing and is no
    case; one without ``outcome`` is taken as ``cancelled``."""
    result = RuleResult("cancel")
    starts, nacks = h.per_id("start"), h.per_id("nack")
    for request in h.of("cancel_ok"):
        if request.get("outcome") == "not_found":
            continue
        result.cases += 1
        mid = request["id"]
        heard_by = request["at"] + request["err"]
        if request.get("outcome") == "requested":
            heard_by += h.tolerance["cancel_notice_ms"]
            if any(n["at"] - n["err"] <= heard_by for n in nacks.get(mid, [])):
                continue
        late = [s for s in starts.get(mid, []) if s["at"] - s["err"] > heard_by]
        if late:
            result.violation([mid], "started after its cancel was acknowledged", request, late[0])
    return result


def schedule(h: History) -> RuleResult:
    """Each tick fires once ("each tick is enqueued exactly once", docs/guide/schedules.md), and none is skipped
    while a scheduler could fire it: with ``missed="skip"`` (a ``schedule_config`` may say ``missed``, default
    skip) a scheduler that comes back after missed ticks enqueues only the latest, so a tick missing between two
    fired ones is a defect only if a scheduler of the schedule was alive from the tick until the next was due
    (plus ``schedule_slack_ms``), none was killed then and no outage fault overlapped that time; with
    ``catch_up`` a scheduler enqueues the missed ticks when it comes back, so only a kill or an outage excuses a
    missing one. Each fired tick and each missing one is a case."""
    result = RuleResult("schedule")
    configs: dict[str, Record] = {}
    schedulers: dict[str, set[str]] = defaultdict(set)
    for record in h.of("schedule_config"):
        configs.setdefault(record["schedule"], record)
        schedulers[record["schedule"]].add(record["proc"])
    fired: dict[str, dict[float, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for tick in h.of("tick"):
        result.cases += 1
        fired[tick["schedule"]][tick["tick_at"]].append(tick)
    for name, ticks in fired.items():
        for tick_at, records in ticks.items():
            if len(records) > 1:
                result.violation([f"{name}@{tick_at}"], "tick fired more than once", *records)
        config = configs.get(name)
        if config is not None:
            _check_missing_ticks(h, result, config, sorted(ticks), schedulers[name])
    return result


def _check_missing_ticks(h: History, result: RuleResult, config: Record, ticks: list[float],
                         procs: set[str]) -> None:
    """The ticks due between consecutive fired ones that a live scheduler should have fired."""
    every = config["every_ms"]
    until = h.tolerance["schedule_slack_ms"] + every
    evidence = [r for r in h.of("tick") if r["schedule"] == config["schedule"]]
    for previous, following in zip(ticks, ticks[1:], strict=False):
        missing = previous + every
        while missing < following - every / 2:
            result.cases += 1
            if not _excused(h, procs, missing, missing + until, catch_up=config.get("missed") == "catch_up"):
                result.violation([f"{config['schedule']}@{missing}"], "tick skipped while a scheduler was alive",
                                 *[r for r in evidence if r["tick_at"] in (previous, following)])
            missing += every


def _excused(h: History, procs: set[str], start: float, end: float, *, catch_up: bool) -> bool:
    """Whether a tick due at ``start`` may be missing from the history: an outage fault overlapped its time to
    fire, a scheduler was killed in it (it may have fired the tick and died before writing it down), or (with
    ``skip``) no scheduler was alive throughout it."""
    if _outage(h, start, end) or any(start <= k["at"] <= end for p in procs if (k := h.killed.get(p))):
        return True
    return not catch_up and not any(h.first_at[p] <= start and h.alive_until(p)["at"] >= end for p in procs)


def _outage(h: History, start: float, end: float) -> bool:
    """Whether an outage fault overlaps ``[start, end]``: its record may be written as it begins or as it ends,
    so it is taken to cover its length (``ms``) on either side of its ``at``."""
    kinds = h.tolerance["outage_faults"]
    for fault in h.of("fault"):
        length = fault.get("ms", h.tolerance["outage_ms"]) + fault["err"]
        if fault.get("kind") in kinds and fault["at"] - length <= end and fault["at"] + length >= start:
            return True
    return False


def reader_group(h: History) -> RuleResult:
    """Per (stream, reader group, partition), positions handed out neither go back behind the group's committed
    position nor skip what was pushed. A group's committed position "is the first position it has not read: every
    message before it was read" (docs/FORMAT.md, Streams), and "no group commits past it unread"
    (docs/guarantees.md): a ``read`` of a position below a ``commit_pos`` surely before it is a violation (a
    re-read of what was not committed, after a reader stopped before its ack was written, is allowed); a pushed
    position (``push_ok`` of kind stream with ``partition`` and ``position``) from the group's first read up to
    its last commit that the group never read is a skip. Each read and each such push is a case."""
    result = RuleResult("reader_group")
    reads: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    commits: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    for record in h.of("read"):
        reads[(record["stream"], record["reader_group"], record["partition"])].append(record)
    for record in h.of("commit_pos"):
        commits[(record["stream"], record["reader_group"], record["partition"])].append(record)
    pushed: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for push in h.of("push_ok"):
        if push["kind"] == "stream" and push.get("position") is not None:
            pushed[(push["queue"], push.get("partition", 0))].append(push)
    for key, handed in reads.items():
        result.cases += len(handed)
        _check_no_read_behind_commit(result, key, handed, commits.get(key, []))
        group_commits = commits.get(key, [])
        if not group_commits:
            continue
        last_commit = max(group_commits, key=lambda c: c["position"])
        first_read = min(r["position"] for r in handed)
        read_positions = {r["position"] for r in handed}
        for push in pushed.get((key[0], key[2]), []):
            if first_read <= push["position"] < last_commit["position"]:
                result.cases += 1
                if push["position"] not in read_positions:
                    result.violation([push["id"]], f"{_name(key)}: position {push['position']} committed unread",
                                     push, last_commit)
    return result


def _name(key: tuple[str, str, int]) -> str:
    """A (stream, group, partition) as text."""
    return f"stream {key[0]} group {key[1]} partition {key[2]}"


def _check_no_read_behind_commit(result: RuleResult, key: tuple[str, str, int], reads: list[Record],
                                 commits: list[Record]) -> None:
    """A read of a position below a commit surely before it."""
    by_upper = sorted(commits, key=lambda c: c["at"] + c["err"])
    highest: Record | None = None
    i = 0
    for read in sorted(reads, key=lambda r: r["at"] - r["err"]):
        while i < len(by_upper) and surely_before(by_upper[i], read):
            if highest is None or by_upper[i]["position"] > highest["position"]:
                highest = by_upper[i]
            i += 1
        if highest is not None and read["position"] < highest["position"]:
            result.violation([read["id"]], f"{_name(key)}: position {read['position']} read after the group "
                             f"committed {highest['position']}", highest, read)


def rate_limit(h: History) -> RuleResult:
    """At most ``count`` plus ``rate_extra`` starts of a queue with a ``rate_limit`` surely within any span of its
    ``per_s``. Each start opens a span that is a case."""
    result = RuleResult("rate_limit")
    for queue, config in h.configs.items():
        if config.get("rate_limit"):
            _check_rate(h, result, queue, config["rate_limit"])
    return result


def _check_rate(h: History, result: RuleResult, queue: str, limit: Record) -> None:
    """The spans of ``queue``'s starts over its limit."""
    extra = h.tolerance["rate_extra"]
    allowed = limit["count"] + (limit["count"] if extra is None else extra)
    span = limit["per_s"] * 1000
    starts = sorted((s for s in h.of("start") if s["queue"] == queue), key=lambda s: s["at"] - s["err"])
    lowers = [s["at"] - s["err"] for s in starts]
    reported_to = -1  # a burst over the limit is reported once, not once per start in it
    for i in range(len(starts)):
        result.cases += 1
        window_end = lowers[i] + span
        inside = [j for j in range(i, bisect.bisect_left(lowers, window_end))
                  if starts[j]["at"] + starts[j]["err"] < window_end]
        if len(inside) > allowed and i > reported_to:
            result.violation([starts[j]["id"] for j in inside], f"{queue}: {len(inside)} starts within "
                             f"{limit['per_s']} s, at most {allowed} allowed", *[starts[j] for j in inside])
            reported_to = inside[-1]


RULES: tuple[Callable[[History], RuleResult], ...] = (
    lost, redelivered_after_flushed_ack, ordered_group, unique, cancel, schedule, reader_group, rate_limit)


def check_records(records: Iterable[Record]) -> Verdict:
    """Every rule over a history given as records."""
    history = History(records)
    return Verdict([rule(history) for rule in RULES])


def read_history(run_dir: Path) -> Iterator[Record]:
    """The records of ``<run_dir>/history/*.jsonl``. A process killed while it wrote leaves its last line cut:
    that line is left out; a bad line anywhere else is an error, and so is a run without a history."""
    history = Path(run_dir) / "history"
    if not history.is_dir():
        raise FileNotFoundError(f"no history in {run_dir}: {history} is not a directory")
    for path in sorted(history.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                if n != len(lines) - 1:
                    raise ValueError(f"{path}:{n + 1}: not a JSON record: {line[:80]!r}") from None


def check(run_dir: Path | str) -> Verdict:
    """Every rule over the history of the run in ``run_dir``."""
    return check_records(read_history(Path(run_dir)))


def main(argv: list[str]) -> int:
    """``python -m tests.soak.checker <run>``: print the verdict as JSON; 1 unless it passed."""
    if len(argv) != 1:
        print("usage: python -m tests.soak.checker <run dir>", file=sys.stderr)
        return 2
    verdict = check(argv[0])
    print(json.dumps(verdict.to_json()))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

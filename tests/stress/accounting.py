"""Compare what the writers were acknowledged with what the consumers processed. Pure: no I/O.

Terms (every count is of distinct messages ``(w, g, s)`` unless it says otherwise):

written      pushes that returned (``ok`` in a writer log): each must be processed, at least once.
processed    messages with at least one ``processed`` record (a handler ran on them).
lost         written, and never processed.
unexpected   records that are not of a message a writer attempted, or whose payload arrived corrupted,
             plus one message stored twice under two ids (a producer-side duplicate).
committed    a record whose ``ack()`` returned (the consumer logged ``ack``).
duplicated   messages committed more than once outside the documented at-least-once windows: must be 0,
             with or without dedupe. With dedupe every repeated commit counts (a keyed ack is stored before
             ``ack()`` returns). Without dedupe an ack is kept in memory until the next state flush, so a
             repeat is *explained* (``duplicates_explained``, not counted here) when every earlier commit comes
             from a consumer that was SIGKILLed, or whose lease on that bucket ran out before the flush got
             through (the library warns "lease on bucket B lost; its unflushed state was refused": with a
             2 s lease, a server restart can do it), and each delivery has more tries than the one before it
             (it came from a later claim), after the lease the earlier consumer believed it held had ended.
             Same tries twice: the bucket was stored again; fewer tries later, or a delivery within another
             consumer's lease: two consumers held the bucket at once (a stale lease, a clock step).
redelivered_in_flight
             messages handled more than once where at most one of the handlings was committed: a consumer
             was killed (or lost its lease) between the handler's side effect and ``ack()`` returning. At-least-
             once delivery allows one extra handling per message in flight at a kill, with or without dedupe;
             each uncommitted record must come from a killed consumer or an ``ack()`` that raised LeaseLost.
unacked      pushes attempted by writers that were killed before ``push`` returned: they may be lost, and
             are counted apart (``survived`` were processed anyway, ``lost`` were not).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from tests.stress.common import ordered_group

Msg = tuple[int, int, int]
# A consumer serves a message only while it believes it holds the bucket's lease (``lease``: the seconds it
# believed it had left); another claim can come only once that lease ran out on the server. Records are timed
# on one host's real clock, and clocks agree with the server's within milliseconds: this much slack is ample.
OVERLAP_SLACK_S = 0.1


@dataclass
class WriterLog:
    writer: int
    gen: int
    attempted: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    done: bool = False

    def feed(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        if parts[0] == "ok":
            self.acked.add(int(parts[1]))
        elif parts[0] == "t":
            self.attempted.update(range(int(parts[1]), int(parts[2])))
        elif parts[0] == "fail":
            self.failed.add(int(parts[1]))
        elif parts[0] == "done":
            self.done = True


def parse_writer_log(writer: int, gen: int, text: str) -> WriterLog:
    log = WriterLog(writer, gen)
    for line in text.splitlines():
        log.feed(line)
    return log


@dataclass
class ConsumerLog:
    committed: set[str] = field(default_factory=set)
    lease_lost: set[str] = field(default_factory=set)
    ack_failed: set[str] = field(default_factory=set)
    buckets_lost: set[tuple[int, str]] = field(default_factory=set)  # (pid, bucket id): flush refused
    acked_at: dict[str, float] = field(default_factory=dict)  # record id -> real time after its ack returned


def parse_consumer_logs(texts: Iterable[str]) -> ConsumerLog:
    out = ConsumerLog()
    for text in texts:
        for line in text.splitlines():
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "ack":
                out.committed.update(parts[1:])
            elif parts[0] == "lost":
                out.lease_lost.update(parts[1:])
            elif parts[0] == "err":
                out.ack_failed.add(parts[1])
            elif parts[0] == "leaselost":
                out.buckets_lost.add((int(parts[1]), parts[2]))
            elif parts[0] == "acked":
                out.acked_at.update(dict.fromkeys(parts[2:], float(parts[1])))
    return out


def account_groups(records: Iterable[Mapping[str, Any]], consumers: ConsumerLog, *, groups: int,
                   killed_pids: set[int]) -> dict[str, Any]:
    """The ordered groups' report. Per group, records in the order they were served (``at``):

    order_violations  a message first delivered before an earlier message of its group was first delivered
                      (pushes are made in seq order): must be 0
    overlaps          a message served before the previous record of its group was acked: two messages of a
                      group handled at once, must be 0 outside the documented window: the previous handling
                      was by a consumer that was killed or whose lease ran out (its ack unknown or refused)
    redelivered       records that went back in their group (a message delivered again after a crash or a
                      lost lease, with the ones after it): allowed, counted apart
    """
    by_group: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if not r.get("problem") and (name := _group_of(r, groups)) is not None:
            by_group[name].append(r)
    violations: list[str] = []
    overlaps: list[str] = []
    redelivered = 0
    for name, rs in by_group.items():
        rs = sorted(rs, key=lambda r: r["at"])
        firsts = [r["s"] for r in rs if r is min((x for x in rs if x["s"] == r["s"]), key=lambda x: x["at"])]
        violations += [f"group {name}: {b} first delivered before {a}" for a, b in pairwise(firsts) if b < a]
        for a, b in pairwise(rs):
            redelivered += b["s"] <= a["s"]
            ended = consumers.acked_at.get(str(a["_id"]))
            window = (a["pid"] in killed_pids or str(a["_id"]) in consumers.lease_lost
                      or (a["pid"], str(a["mid"]).split(":")[0]) in consumers.buckets_lost)
            if ended is not None and not window and b["at"] < ended - OVERLAP_SLACK_S:
                overlaps.append(f"group {name}: {b['s']} served {ended - b['at']:.3f} s before {a['s']} was acked")
    return {"groups": len(by_group), "records": sum(len(rs) for rs in by_group.values()),
            "order_violations": len(violations), "overlaps": len(overlaps), "redelivered": redelivered,
            "problems": (violations + overlaps)[:20]}


def _group_of(record: Mapping[str, Any], groups: int) -> str | None:
    return ordered_group(record["w"], record["g"], record["s"], groups)  # the writers' own rule


def account(writer_logs: Iterable[WriterLog], records: Iterable[Mapping[str, Any]], consumers: ConsumerLog, *,
            killed_pids: set[int], dedupe: bool, max_in_flight_per_kill: int) -> dict[str, Any]:
    written: set[Msg] = set()
    attempted: set[Msg] = set()
    for log in writer_logs:
        written.update((log.writer, log.gen, s) for s in log.acked)
        attempted.update((log.writer, log.gen, s) for s in log.attempted | log.acked | log.failed)

    by_msg: dict[Msg, list[Mapping[str, Any]]] = defaultdict(list)
    unexpected_records: list[str] = []
    for r in records:
        if r.get("problem"):
            unexpected_records.append(f"{r['mid']}: {r['problem']}")
            continue
        msg = (r["w"], r["g"], r["s"])
        if msg not in attempted:
            unexpected_records.append(f"{r['mid']}: message {msg} was never pushed")
            continue
        by_msg[msg].append(r)

    stored_twice = sorted(m for m, rs in by_msg.items() if len({r["mid"] for r in rs}) > 1)
    processed = set(by_msg)
    lost = written - processed
    unacked = attempted - written

    duplicated: dict[Msg, str] = {}  # outside the at-least-once windows: its cause
    explained: list[Msg] = []
    redelivered: list[Msg] = []
    unexplained_uncommitted: list[str] = []
    uncommitted_by_killed: dict[int, int] = defaultdict(int)
    for msg, rs in by_msg.items():
        committed = [r for r in rs if str(r["_id"]) in consumers.committed]
        for r in rs:
            rid = str(r["_id"])
            if rid in consumers.committed or rid in consumers.lease_lost or rid in consumers.ack_failed:
                continue  # committed, or its ack() said it was not
            if r["pid"] in killed_pids:
                uncommitted_by_killed[r["pid"]] += 1  # in flight when its consumer was killed
            else:
                unexplained_uncommitted.append(rid)
        if len(committed) > 1:
            why = _unexplained(rs, committed, consumers, killed_pids=killed_pids, dedupe=dedupe)
            if why is None:
                explained.append(msg)
            else:
                duplicated[msg] = why
        elif len(rs) > 1:
            redelivered.append(msg)
    over_limit = {pid: n for pid, n in uncommitted_by_killed.items() if n > max_in_flight_per_kill}

    return {
        "written": len(written),
        "processed": len(processed),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "duplicates_explained": len(explained),
        "redelivered_in_flight": len(redelivered),
        "leases_lost": len(consumers.buckets_lost),
        "unexpected": len(unexpected_records) + len(stored_twice),
        "unacked_pushes": {"attempted": len(unacked), "survived": len(unacked & processed),
                           "lost": len(unacked - processed)},
        "problems": {
            "lost": [_name(m) for m in sorted(lost)[:20]],
            "unexpected": unexpected_records[:20] + [f"{_name(m)} stored twice" for m in stored_twice[:20]],
            # a few messages of each cause, and what each cause means
            "duplicated": [f"{_name(m)} ({cause})" for cause in sorted(set(duplicated.values()))
                           for m in sorted(m for m, c in duplicated.items() if c == cause)[:5]],
            "duplicated_by_cause": {cause: {"count": n, "means": CAUSES[cause]}
                                    for cause, n in sorted(Counter(duplicated.values()).items())},
            "uncommitted_without_kill": unexplained_uncommitted[:20],
            "in_flight_over_limit": {str(k): v for k, v in over_limit.items()},
        },
        "_counts": {"uncommitted_without_kill": len(unexplained_uncommitted), "in_flight_over_limit": len(over_limit)},
    }


# What an unexplained duplicate looks like, by cause: the report counts them under these names.
CAUSES = {
    "stored_again": "delivered twice with the same tries: its bucket was stored again after it had been consumed "
                    "(a bucket insert retried after its lost reply)",
    "stale_lease": "handled by a consumer whose lease had run out, after another consumer had claimed the bucket "
                   "again (fewer tries, later): two consumers held the bucket at once",
    "lease_overlap": "delivered again while its first consumer still held the lease, by that consumer's own clock: "
                     "two consumers held the bucket at once (a lease expired as it was taken, a clock step)",
    "keyed_ack_after_lease": "its first consumer had lost the lease: a keyed ack returned after the lease ran out",
    "keyed_ack_repeated": "a keyed ack returned, and the message was delivered and acked again",
    "ack_not_kept": "an ack was undone although its consumer was neither killed nor told its lease was lost (a "
                    "fenced write taken as applied that was not)",
}


def _unexplained(records: list[Mapping[str, Any]], committed: list[Mapping[str, Any]], consumers: ConsumerLog, *,
                 killed_pids: set[int], dedupe: bool) -> str | None:
    """The cause (a key of ``CAUSES``) that puts a message committed more than once outside the at-least-once
    windows, or None when it is in one. Without dedupe it is when each commit but the last was undone because
    its ack never reached the bucket (its consumer was SIGKILLed before the state flush, or its lease ran out
    and the flush was refused: LeaseLost), and each delivery came from a later claim than the one before
    (more tries), after the lease the earlier consumer believed it held."""
    in_time = sorted(records, key=lambda r: r["at"])
    if any(b["tries"] <= a["tries"] for a, b in pairwise(in_time)):
        return "stored_again" if len({r["tries"] for r in records}) < len(records) else "stale_lease"
    for a in committed:
        if any(a["at"] < b["at"] < a["at"] + a.get("lease", 0.0) - OVERLAP_SLACK_S for b in records):
            return "lease_overlap"
    earlier = sorted(committed, key=lambda r: r["at"])[:-1]
    lease_lost = [(r["pid"], str(r["mid"]).split(":")[0]) in consumers.buckets_lost for r in earlier]
    if dedupe:
        return "keyed_ack_after_lease" if any(lease_lost) else "keyed_ack_repeated"
    if not all(r["pid"] in killed_pids or lost for r, lost in zip(earlier, lease_lost, strict=True)):
        return "ack_not_kept"
    return None


def _name(msg: Msg) -> str:
    return "{}.{}.{}".format(*msg)

"""The report: ratios to bucketq, the goals (PASS/MISS), the printed table, results/latest.json, the chart."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from bench.contenders import ALL
from bench.plan import MAIN_SCENARIOS, human_bytes
from bucketq.shell.wakeup import SAFETY_POLL_S

RESULTS = Path(__file__).resolve().parent / "results"
COLORS = {"bucketq": "tab:blue", "keuss": "tab:orange", "naive": "tab:green", "floor": "tab:red",
          "encode": "tab:gray", "decode": "tab:brown"}
# The idle goal: 1,000 idle consumers send fewer than 100 queries a second besides their change streams.
IDLE_COMMANDS_PER_MINUTE = 100 / 1000 * 60
# An idle consumer's safety poll: one of each (it reads the pause document only after a change-stream event)
SAFETY_POLL_KINDS = ("claims", "next_due")
# An idle stream reader's safety poll is a look at its group (1 partition): the group, the counters, the window
# and the group's claims there, all "other" (a claim only when it finds a bucket).
STREAM_LOOK_KINDS, STREAM_LOOK_COMMANDS = ("other",), 4
TEST_SERVER_CAVEAT = (
    "Against a test server, not a real mongod: these figures compare client efficiency and round trips "
    "(commands per message, client CPU), not MongoDB's speed."
)


def _key(row: dict) -> tuple:
    return row["scenario"], row["payload_bytes"], row["processes"], row.get("write_concern", "1")


def _cell(row: dict) -> str:
    wc = "" if row.get("write_concern", "1") == "1" else f" w:{row['write_concern']}"
    return f"{human_bytes(row['payload_bytes'])} x{row['processes']}{wc}"


def cpu_ratio(mine: dict, other: dict) -> tuple[float, str]:
    """``mine``'s client CPU per message over ``other``'s, and how it was taken. Rounds of one cell run in turn
    (bucketq's first round, the floor's first, ...): there, the median of each round's ratio to the round beside
    it, so that a slow minute of the machine falls on both sides of a ratio. Rows of different cells (the Spark
    read's, or a cell the floor did not run in) ran minutes apart: the ratio of their median rounds' CPU."""
    ours, theirs = mine.get("cpu_rounds") or [], other.get("cpu_rounds") or []
    if len(ours) > 1 and _key(mine) == _key(other) and len(ours) == len(theirs) and None not in ours + theirs:
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        return statistics.median(ratios), (f"median of {len(ratios)} paired rounds: "
                                           + ", ".join(f"{r:.2f}x" for r in ratios)
                                           + f"; {_us(statistics.median(ours))} vs {_us(statistics.median(theirs))} us")
    a = statistics.median(ours) if ours and None not in ours else mine["cpu_s_per_1000"]
    b = statistics.median(theirs) if theirs and None not in theirs else other["cpu_s_per_1000"]
    rounds = "median rounds, " if len(ours) > 1 else ""
    return a / b, f"{rounds}{_us(a)} vs {_us(b)} us"


def _us(cpu_s_per_1000: float) -> str:
    return f"{1000 * cpu_s_per_1000:.2f}"


def add_ratios(rows: list[dict]) -> None:
    base = {_key(r): r["msgs_per_s"] for r in rows if r["contender"] == "bucketq" and r.get("msgs_per_s")}
    for r in rows:
        b = base.get(_key(r))
        r["ratio_to_bucketq"] = r["msgs_per_s"] / b if b and r.get("msgs_per_s") else None


def add_ceilings(rows: list[dict], cores: int) -> None:
    """``cpu_ceiling_msgs_per_s``: the most a row's measured CPU per message allows on ``cores`` cores, where
    the client's and the server's CPU share the cores and the client gets ``client_cores`` of them at most (one
    per worker process, each one event loop; every core for a row without it, such as Spark's local[*]). A goal
    above it needs less CPU per message, not less waiting. None without both CPU figures."""
    for r in rows:
        client, server = r.get("cpu_s_per_1000"), r.get("server_cpu_s_per_1000")
        if not client or server is None:
            r["cpu_ceiling_msgs_per_s"] = None
            continue
        r["cpu_ceiling_msgs_per_s"] = 1000.0 * min(cores / (client + server), r.get("client_cores", cores) / client)


def _ceiling_note(row: dict, needed: float) -> str:
    ceiling = row.get("cpu_ceiling_msgs_per_s")
    if ceiling is None:
        return ""
    where = "below" if ceiling < needed else "above"
    return (f"; CPU per msg: client {row['cpu_s_per_1000']:.4f} ms + server {row['server_cpu_s_per_1000']:.4f} ms, "
            f"ceiling {ceiling:,.0f}/s, {where} the {needed:,.0f}/s the goal needs")


def goals(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(PASS | MISS | n/a | info, goal, detail) per goal, judged on the worst w:1 cell."""
    mine = [r for r in rows if r["contender"] == "bucketq" and r.get("write_concern", "1") == "1"]
    index = {(r["contender"], *_key(r)): r for r in rows}
    out = []

    def versus(scenario: str, other: str, factor: float, other_scenario: str | None = None) -> None:
        share = f"{factor:g}x" if factor >= 1 else f"{factor:.0%} of"
        text = f"bucketq {scenario} >= {share} {other}" + (f" {other_scenario}" if other_scenario else "")
        pairs, incomplete = [], 0
        for b in (r for r in mine if r["scenario"] == scenario):
            o = index.get((other, other_scenario or scenario, *_key(b)[1:]))
            if o and o.get("msgs_per_s") and not o.get("complete", True):
                incomplete += 1  # the other side lost messages: its rate says nothing
            elif o and o.get("msgs_per_s"):
                mine_rate = b.get("msgs_per_s") if b.get("complete", True) else None
                pairs.append(((mine_rate or 0.0) / o["msgs_per_s"], _cell(b), b, o))
        skipped = f" ({incomplete} cell(s) skipped: {other} incomplete)" if incomplete else ""
        if not pairs:
            out.append(("n/a", text, "nothing to compare" + skipped))
            return
        worst, cell, b, o = min(pairs, key=lambda pair: pair[0])
        why = "" if worst >= factor else _ceiling_note(b, factor * o["msgs_per_s"])
        out.append(("PASS" if worst >= factor else "MISS", text, f"worst {worst:.2f}x at {cell}{skipped}{why}"))

    def commands(scenario: str, limit: float) -> None:
        text = f"bucketq <= {limit:g} commands / 1000 {scenario}"
        values = [(r.get("commands_per_1000"), _cell(r)) for r in mine if r["scenario"] == scenario]
        if not values:
            out.append(("n/a", text, "no bucketq result"))
            return
        worst, cell = max(values, key=lambda v: math.inf if v[0] is None else v[0])
        ok = worst is not None and worst <= limit
        out.append(("PASS" if ok else "MISS", text, f"worst {'none' if worst is None else f'{worst:.2f}'} at {cell}"))

    def latency() -> None:
        """Sequential awaited pushes on an idle queue: p50 within 5 ms of one insert's round trip (the floor's
        latency row, same cell), p99 within 20 ms."""
        rows = [r for r in mine if r["scenario"] == "latency" and r.get("p50_ms") is not None]
        p50_text, p99_text = "bucketq latency p50 <= insert round trip + 5 ms", "bucketq latency p99 <= 20 ms"
        if not rows:
            out.extend([("n/a", p50_text, "no bucketq latency result"), ("n/a", p99_text, "no bucketq latency result")])
            return
        floors = [(r, index.get(("floor", *_key(r)))) for r in rows]
        if any(f is None or f.get("p50_ms") is None for _, f in floors):
            out.append(("n/a", p50_text, "no floor latency row (the insert round trip) to compare with"))
        else:
            over, row, floor = max((r["p50_ms"] - f["p50_ms"], r, f) for r, f in floors)
            out.append(("PASS" if over <= 5.0 else "MISS", p50_text,
                        f"p50 {row['p50_ms']:.2f} ms vs insert round trip {floor['p50_ms']:.2f} ms at {_cell(row)}"))
        worst = max(rows, key=lambda r: r["p99_ms"])
        out.append(("PASS" if worst["p99_ms"] <= 20.0 else "MISS", p99_text,
                    f"p99 {worst['p99_ms']:.2f} ms at {_cell(worst)}"))

    def idle(scenario: str, who: str, poll_kinds: tuple[str, ...], poll_commands: int) -> None:
        """Consumers waiting on an empty queue (readers on a stream with nothing new): commands other than their
        change streams' per consumer per minute; a safety poll sends ``poll_commands`` of ``poll_kinds``."""
        text = f"bucketq {scenario} <= {IDLE_COMMANDS_PER_MINUTE:g} non-stream cmds / {who} / min"
        rows = [r for r in mine if r["scenario"] == scenario and r.get("idle")]
        if not rows:
            out.append(("n/a", text, f"no bucketq {scenario} result"))
            return
        idle = rows[0]["idle"]
        per, worst = idle["per_consumer_minute"], idle["non_stream_per_consumer_minute"]
        split = ", ".join(f"{v:.1f} {kind}" for kind, v in per.items())
        unseen = ""
        if idle["window_s"] < SAFETY_POLL_S[1]:
            # A window the safety poll may miss: what it saw of the poll's kinds, or at least the poll's rate over
            # a fleet (its jitter is uniform, so a fleet polls at the mean interval).
            rate = poll_commands * 60 / (sum(SAFETY_POLL_S) / 2)
            seen = sum(per.get(kind, 0.0) for kind in poll_kinds)
            worst += max(0.0, rate - seen)
            unseen = (f"; counted as {max(rate, seen):.1f} {'+'.join(poll_kinds)}: at least a safety poll every "
                      f"{SAFETY_POLL_S[0]:g}-{SAFETY_POLL_S[1]:g} s")
        cpu = idle.get("server_cpu_share")
        out.append(("PASS" if worst <= IDLE_COMMANDS_PER_MINUTE else "MISS", text,
                    f"{worst:.2f} ({split}{unseen}) over {idle['window_s']:.0f} s with {idle['consumers']} "
                    f"{who}s: {worst * 1000 / 60:.0f} queries/s for 1,000"
                    + ("" if cpu is None else f"; server CPU {cpu:.1%} of a core")))

    def sooner(scenario: str, other: str) -> None:
        """Push-to-handler p50 latency at full load below the other's, in every cell both ran."""
        text = f"bucketq {scenario} p50 latency < {other}'s"
        pairs = [(b["p50_ms"], o["p50_ms"], _cell(b)) for b in mine
                 if b["scenario"] == scenario and b.get("p50_ms") is not None
                 and (o := index.get((other, *_key(b)))) and o.get("p50_ms") is not None]
        if not pairs:
            out.append(("n/a", text, "nothing to compare"))
            return
        ours, theirs, cell = max(pairs, key=lambda pair: pair[0] / pair[1])
        out.append(("PASS" if all(b < o for b, o, _ in pairs) else "MISS", text,
                    f"worst {ours:,.0f} vs {theirs:,.0f} ms at {cell}"))

    def cpu(scenario: str, factor: float | None, floor_scenario: str = "push", against: str = "floor",
            payload: int | None = 1024) -> None:
        """bucketq's client CPU per message over the floor's (``against``'s ``floor_scenario`` role, at the
        same payload and processes: its row of bucketq's own cell when it ran there, in turn with bucketq's rounds,
        else its ``floor_scenario`` row), at ``payload`` bytes (None: any), judged in the worst cell; without a
        ``factor``, reported only ("info")."""
        text = (f"bucketq {scenario} client CPU/msg" + (f" <= {factor:g}x" if factor else " vs")
                + f" {against} {floor_scenario}" + (f" ({human_bytes(payload)})" if payload else ""))
        pairs = [(*cpu_ratio(b, f), b) for b in mine
                 if b["scenario"] == scenario and payload in (None, b["payload_bytes"]) and b.get("cpu_s_per_1000")
                 and (f := index.get((against, *_key(b))) or index.get((against, floor_scenario, *_key(b)[1:])))
                 and f.get("cpu_s_per_1000")]
        if not pairs:
            out.append(("n/a", text, "nothing to compare"))
            return
        worst, how, b = max(pairs, key=lambda pair: pair[0])
        status = "info" if factor is None else "PASS" if worst <= factor else "MISS"
        out.append((status, text, f"worst {worst:.2f}x at {_cell(b)} ({how})"))

    for scenario in ("push", "consume"):
        versus(scenario, "keuss", 2.0)
    versus("consume_batch", "keuss", 2.0, other_scenario="consume")  # a batch handler's API vs keuss's only one
    for scenario in ("push", "consume"):
        versus(scenario, "naive", 20.0)
    versus("push", "floor", 0.7)
    versus("spark_read", "naive", 3.0)  # the same messages read through the Spark connector
    versus("stream_push", "bucketq", 0.8, other_scenario="push")  # stream push within 20% of queue push
    sooner("end_to_end", "keuss")
    commands("push", 2.0)
    commands("consume", 5.0)
    latency()
    idle("idle", "consumer", SAFETY_POLL_KINDS, len(SAFETY_POLL_KINDS))
    idle("stream_idle", "reader", STREAM_LOOK_KINDS, STREAM_LOOK_COMMANDS)
    cpu("push", 2.0)  # push_nowait
    cpu("push_many", 2.0)
    cpu("latency", None, "latency")  # await push one by one, beside one insert_one a message
    cpu("consume", 3.0, "consume")  # reserve + ack
    cpu("consume_batch", 2.0, "consume")  # reserve_many + an ack_many of each batch
    # the Spark JVM's CPU per row, buckets vs one document a message (the Spark cell runs at the first payload size)
    cpu("spark_read", 1.0, "spark_read", against="naive", payload=None)
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = [  # header, width, cell
    ("contender", 9, lambda r: r["contender"]),
    ("scenario", 13, lambda r: r["scenario"]),
    ("payload", 7, lambda r: human_bytes(r["payload_bytes"])),
    ("proc", 4, lambda r: str(r["processes"])),
    ("w", 8, lambda r: r.get("write_concern", "1")),
    ("msgs/s", 11, lambda r: _fmt(r.get("msgs_per_s"), ",.0f")),
    ("x bucketq", 9, lambda r: _fmt(r.get("ratio_to_bucketq"), ".2f")),
    ("cmds/1k", 8, lambda r: _fmt(r.get("commands_per_1000"), ".2f")),
    ("cpu s/1k", 8, lambda r: _fmt(r.get("cpu_s_per_1000"), ".3f")),
    ("srv s/1k", 8, lambda r: _fmt(r.get("server_cpu_s_per_1000"), ".3f")),
    ("rss MB", 7, lambda r: _fmt(r.get("peak_rss_mb"), ".0f")),
    ("p50 ms", 7, lambda r: _fmt(r.get("p50_ms"), ".1f")),
    ("p99 ms", 7, lambda r: _fmt(r.get("p99_ms"), ".1f")),
]


def table(rows: list[dict], server: str, real_mongod: bool) -> str:
    lines = [f"Server: {server}", TEST_SERVER_CAVEAT if not real_mongod else "Against a real mongod on this machine."]
    lines.append("  ".join(h.rjust(w) if k > 4 else h.ljust(w) for k, (h, w, _) in enumerate(COLUMNS)) + "  notes")
    for r in rows:
        cells = [f(r) for _, _, f in COLUMNS]
        text = "  ".join(c.rjust(w) if k > 4 else c.ljust(w)
                         for k, (c, (_, w, _)) in enumerate(zip(cells, COLUMNS, strict=True)))
        lines.append(f"{text}  {(r.get('notes') or '')[:90]}")
    lines.append("cmds/1k: server commands per 1000 messages (command monitoring); cpu s/1k, srv s/1k: client and")
    lines.append("server CPU seconds per 1000 messages (srv: the embedded server's /proc figures); rss MB: peak RSS")
    lines.append("summed over the contender's processes; p50/p99: push->handler latency at full load (end_to_end), or")
    lines.append("one sequential awaited push on an idle queue (latency; for floor: one insert's round trip).")
    return "\n".join(lines)


def write_json(rows: list[dict], server: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"server": server, "results": rows}, indent=1) + "\n")
    os.replace(tmp, path)


def chart(rows: list[dict], server: str, real_mongod: bool, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [s for s in MAIN_SCENARIOS if any(r["scenario"] == s and r.get("msgs_per_s") for r in rows)]
    codec = [r for r in rows if r["scenario"] in ("encode", "decode") and r.get("msgs_per_s")]
    count = len(panels) + bool(codec)
    if not count:
        return
    fig, axes = plt.subplots(1, count, figsize=(max(9.0, 5.2 * count), 4.8), squeeze=False)
    for ax, scenario in zip(axes[0], panels, strict=False):
        mine = [r for r in rows if r["scenario"] == scenario and r.get("write_concern", "1") == "1"]
        cells = sorted({(r["payload_bytes"], r["processes"]) for r in mine})
        names = [c for c in ALL if any(r["contender"] == c for r in mine)]
        width = 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            by_cell = {(r["payload_bytes"], r["processes"]): r.get("msgs_per_s")
                       for r in mine if r["contender"] == name}
            values = [by_cell.get(c) or math.nan for c in cells]
            ax.bar([i + k * width for i in range(len(cells))], values, width, label=name, color=COLORS[name])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))])
        ax.set_xticklabels([f"{human_bytes(p)} x{n}" for p, n in cells])
        ax.set_title(scenario)
        ax.set_yscale("log")
        ax.set_ylabel("messages / s")
        ax.legend(fontsize=8)
    if codec:
        ax = axes[0][-1]
        sizes = sorted({r["payload_bytes"] for r in codec})
        for k, op in enumerate(("encode", "decode")):
            by_size = {r["payload_bytes"]: r["msgs_per_s"] for r in codec if r["scenario"] == op}
            values = [by_size.get(s) or math.nan for s in sizes]
            ax.bar([i + k * 0.4 for i in range(len(sizes))], values, 0.4, label=op, color=COLORS[op])
        ax.set_xticks([i + 0.2 for i in range(len(sizes))])
        ax.set_xticklabels([human_bytes(s) for s in sizes])
        ax.set_title("codec only (orjson)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    for ax in axes[0]:
        low = min((bar.get_height() for bar in ax.patches if bar.get_height() > 0), default=1.0)
        ax.set_ylim(bottom=low / 4)
    caveat = "" if real_mongod else "\nclient efficiency and round trips on a test server, not MongoDB's speed"
    fig.suptitle(f"bucketq bench: {server}{caveat}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

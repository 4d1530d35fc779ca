"""The soak run's fault schedule: a pure function of the seed and the minutes, so that a replay with the seed
injects the same faults at the same moments (what each one hits is decided when it fires only where it depends
on what runs then: a proxy command fault hits the next matching command).

Faults start after a warm-up and stop before the drain, a few seconds apart. Of each killable role only the
processes numbered ``CONTROL`` and up are killed: the ones below are the control set, never killed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

WARM_UP_S = 10.0
QUIET_END_S = 20.0  # no faults in the run's last seconds: the drain that follows starts from a settled queue
GAP_S = (3.0, 8.0)  # between two faults
KILLABLE = ("producer", "worker", "consumer")
CONTROL = 1  # processes 0 .. CONTROL-1 of each killable role are never killed
LEASE_S = 2.0
STALL_S = (LEASE_S + 1.0, 2 * LEASE_S + 1.0)  # a server stall outlasts a lease
CLOCK_STEP_S = (20.0, 180.0)
HELD_RETRY_S = (LEASE_S + 0.5, 3 * LEASE_S)
SLOW_PHASE = (0.35, 0.55)  # share of the run: consumers slow down, the backlog grows, producers are held back
# The mix, by weight; restarts and stalls are rarer, as they pause everything.
WEIGHTS = {"kill": 5, "cut": 2, "lose_reply": 2, "lose_request": 2, "delayed_retry": 1, "clock_step": 2,
           "restart": 1, "stall": 1}


@dataclass(frozen=True)
class Fault:
    """One fault: at ``at_s`` seconds into the run, ``kind``, with what it needs in ``params``."""

    at_s: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    def as_record(self) -> dict[str, Any]:
        """The fault as the fields of its ``fault`` history record."""
        return {"kind": self.kind, "at_s": round(self.at_s, 3), **self.params}


def plan(seed: int, minutes: float, *, killable: dict[str, int]) -> list[Fault]:
    """The faults of a run of ``minutes`` with ``seed``; ``killable[role]`` is how many processes of that role
    run (the control set is excluded from the victims). At least one server restart, one stall and the slow
    phase in every run; the rest drawn by ``WEIGHTS``."""
    rng = random.Random(f"soak:{seed}:{minutes}")
    length = minutes * 60.0
    end = length - QUIET_END_S
    faults = [Fault(round(length * share, 3), kind) for share, kind in zip(SLOW_PHASE, ("slow_start", "slow_end"),
                                                                         strict=True)]
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    at = WARM_UP_S
    drawn: list[Fault] = []
    while True:
        at += rng.uniform(*GAP_S)
        if at >= end:
            break
        drawn.append(Fault(round(at, 3), rng.choices(kinds, weights)[0]))
    musts = ("restart", "stall")
    for must in musts:  # one of each at least, replacing another drawn fault, in the run's middle half if it can
        if not any(f.kind == must for f in drawn):
            others = [i for i, f in enumerate(drawn) if f.kind not in musts]
            middle = [i for i in others if length * 0.25 <= drawn[i].at_s <= length * 0.75] or others
            if middle:
                i = rng.choice(middle)
                drawn[i] = Fault(drawn[i].at_s, must)
    faults += [Fault(f.at_s, f.kind, _params(f.kind, rng, killable)) for f in drawn]
    return sorted(faults, key=lambda f: f.at_s)


def _params(kind: str, rng: random.Random, killable: dict[str, int]) -> dict[str, Any]:
    if kind == "kill":
        roles = [r for r in KILLABLE if killable.get(r, 0) > CONTROL]
        role = rng.choice(roles)
        return {"role": role, "index": rng.randrange(CONTROL, killable[role])}
    if kind in ("lose_reply", "lose_request", "delayed_retry"):
        # A bucket insert lost before the server applied it is a plain failed write: only replies are lost there.
        target = "bucket_insert" if kind != "lose_request" and rng.random() < 0.5 else "fenced_write"
        held = round(rng.uniform(*HELD_RETRY_S), 3) if kind == "delayed_retry" else 0.0
        action = "lose_reply" if kind != "lose_request" else "lose_request"
        return {"target": target, "action": action, "held_s": held}
    if kind == "clock_step":
        return {"step_s": round(rng.choice([-1, 1]) * rng.uniform(*CLOCK_STEP_S), 1), "pick": round(rng.random(), 6)}
    if kind == "stall":
        return {"seconds": round(rng.uniform(*STALL_S), 3)}
    return {}

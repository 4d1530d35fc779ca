"""The soak run's fault schedule (``tests/soak/faults.py``): a replay with a seed injects what the run with it
did, whatever the process (string hashing differs between interpreters), and the schedule keeps its promises:
faults only between the warm-up and the quiet end, a few seconds apart, the control set never killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.soak.faults import CONTROL, GAP_S, KILLABLE, QUIET_END_S, WARM_UP_S, plan

ROOT = Path(__file__).resolve().parent.parent
KILLABLE_COUNTS = {"producer": 2, "worker": 3, "consumer": 2}


def as_json(seed: int, minutes: float) -> str:
    return json.dumps([f.as_record() for f in plan(seed, minutes, killable=KILLABLE_COUNTS)], sort_keys=True)


def test_a_seed_gives_the_same_schedule_in_another_process_and_another_seed_another():
    script = ("import json; from tests.soak.faults import plan; print(json.dumps([f.as_record() for f in "
              f"plan(41, 3.0, killable={KILLABLE_COUNTS!r})], sort_keys=True))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == as_json(41, 3.0)
    assert as_json(42, 3.0) != as_json(41, 3.0)
    assert as_json(41, 4.0) != as_json(41, 3.0)


def test_faults_fall_between_the_warm_up_and_the_quiet_end_and_spare_the_control_set():
    for seed in range(20):
        faults = plan(seed, 3.0, killable=KILLABLE_COUNTS)
        drawn = [f for f in faults if f.kind not in ("slow_start", "slow_end")]
        kinds = {f.kind for f in drawn}
        assert {"restart", "stall"} <= kinds, (seed, kinds)
        assert all(WARM_UP_S < f.at_s < 3.0 * 60 - QUIET_END_S for f in drawn)
        assert all(b.at_s - a.at_s >= GAP_S[0] - 1e-6 for a, b in zip(drawn, drawn[1:], strict=False))
        kills = [f.params for f in drawn if f.kind == "kill"]
        assert all(k["role"] in KILLABLE and CONTROL <= k["index"] < KILLABLE_COUNTS[k["role"]] for k in kills)
        assert [f.kind for f in faults if f.kind.startswith("slow_")] == ["slow_start", "slow_end"]

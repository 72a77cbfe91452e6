"""The PPO headline benchmark's steady-state arithmetic (benchmarks/ppo_pipeline.py), on
update-end times written out by hand: start-up apart, the median of windows, the
per-seed pairing of (a)/(b), the run order that alternates."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "ppo_pipeline.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ppo_pipeline_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def ends_of(per_update: list[float], t0: float = 100.0) -> dict[int, float]:
    out, t = {}, t0
    for i, dt in enumerate(per_update):
        t += dt
        out[i] = t
    return out


def test_start_up_apart_and_one_slow_window_does_not_move_the_steady_figure(bench):
    # 200 updates: the first one carries 3 s of start-up, 0.1 s each otherwise, and one
    # window (updates 100..119) ran at half speed while the machine was busy elsewhere.
    per = [3.1] + [0.1] * 199
    for i in range(100, 120):
        per[i] = 0.2
    got = bench.steady_state(ends_of(per), 100.0, 1024, bench.warmup_updates(200))
    assert got["warmup_updates"] == 20
    assert len(got["window_s_per_update"]) == 9  # updates 20..199 in windows of 20
    assert got["steady_s_per_update"] == pytest.approx(0.1)
    assert got["steady_steps_per_s"] == pytest.approx(10240)
    assert got["startup_s"] == pytest.approx(3.0)
    # The mean over all steady updates would have counted the slow window: 11% slower.
    assert sum(per[20:]) / 180 == pytest.approx(0.1111, rel=1e-3)


def test_drift_says_which_way_a_run_moved(bench):
    assert bench.drift([1.0, 1.0, 1.0, 1.2, 1.2, 1.2]) == pytest.approx(0.2)
    assert bench.drift([1.0, 1.0, 1.0, 0.9, 0.9, 0.9]) == pytest.approx(-0.1)
    assert bench.drift([1.0, 1.0]) is None  # too few windows to say


def test_ratio_pairs_the_runs_of_one_seed(bench):
    def run(mode, seed, steady, bound):
        return {"mode": mode, "seed": seed, "steady_steps_per_s": steady, "bound": bound}

    speed = {"pipelined": [run("pipelined", 0, 200.0, 1.8), run("pipelined", 1, 100.0, 1.9)],
             "coarse": [run("coarse", 1, 50.0, 1.95), run("coarse", 0, 100.0, 1.85)]}
    got = bench.pipelining_ratio(speed)
    assert got["per_seed"] == pytest.approx([2.0, 2.0])
    assert got["ratio"] == pytest.approx(2.0)
    assert got["bound_coarse"] == pytest.approx(1.9)
    assert got["bound_pipelined"] == pytest.approx(1.85)
    assert bench.pipelining_ratio({"pipelined": speed["pipelined"]}) is None


def test_run_order_alternates_and_leaves_sb3_out_of_the_doubled_runs(bench):
    args = argparse.Namespace(seeds=[0, 1], phases=["speed", "speed2x"],
                              modes=["pipelined", "coarse", "sb3"])
    assert bench.run_order(args) == [
        (0, "speed", ["pipelined", "coarse", "sb3"]),
        (0, "speed2x", ["coarse", "pipelined"]),
        (1, "speed2x", ["pipelined", "coarse"]),
        (1, "speed", ["sb3", "coarse", "pipelined"]),
    ]


def test_evaluation_cost_is_read_from_the_updates_it_delayed(bench):
    # 0.1 s per update; the evaluation at update 9 delayed update 10 by 0.03 s (a rollout
    # rank's evaluation delays the next update); the one at 19, on the learner, lengthens
    # update 19 itself by 0.06 s.
    per = [0.1] * 40
    per[10] += 0.03
    per[19] += 0.06
    got = bench.eval_cost_in_run(ends_of(per), {9, 19}, [(10, 20), (20, 30), (30, 40)])
    # Both delays, 0.09 s, against the 30 steady updates' 3.0 s: 3%.
    assert got == pytest.approx(0.09 / 3.0)
    assert bench.eval_cost_in_run(ends_of(per), set(), [(10, 20)]) is None

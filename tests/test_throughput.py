"""One throughput definition (hetrun.reports.throughput) and `hetrun tune` on top of it.

The runs are hand-written events.jsonl in the runtime's format, where every
answer is known exactly: a pipeline resized between attempts (its own rank
counts per attempt, a queue gap that is no throughput, iterations redone after
the restart counted once in the whole-run figure), tune fitted on the newest
attempt, and tune keeping sizes its own model says would cost more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.cli.tune_cmd import proposal_lines
from hetrun.reports.cost import DEFAULT_PRICES
from hetrun.reports.demand.sizing import propose
from hetrun.reports.throughput import run_throughput, warmup_iterations, window_size


def write(run_dir: Path, lines: list[dict], comps: list[tuple[str, int]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (run_dir / "plan.json").write_text(json.dumps({"components": [
        {"name": n, "ntasks": k, "nodes": k, "cpus_per_task": 1, "gpus_per_node": 0, "mem_mb": 1024}
        for n, k in comps], "slurm": {"partition": "debug"}}))
    return run_dir


def act(rank: int, comp: str, kind: str, it: int, start: float, secs: float, rc: int, **extra: object) -> dict:
    return {"ev": "action", "rank": rank, "component": comp, "type": kind, "id": kind, "iteration": it,
            "start": start, "end": start + secs, "restart_count": rc, "peak_mem": 2**20, **extra}


def attempt(rc: int, t0: float, first_it: int, n: int, period: float, ranks: dict[str, int],
            rollout_s: float, learner_s: float, startup_s: float = 2.0) -> list[dict]:
    """One attempt: ranks start at t0, the first action after ``startup_s``; iteration k ends every
    ``period`` (the first after 3 periods: warm-up); rollouts split 100 steps per iteration."""
    lines: list[dict] = [{"ev": "startup", "rank": 0, "restart_count": rc, "time": t0, "batch_start": t0}]
    rank = 0
    by_comp: dict[str, list[int]] = {}
    for comp, k in ranks.items():
        by_comp[comp] = list(range(rank, rank + k))
        lines += [{"ev": "start", "rank": r, "component": comp, "restart_count": rc, "time": t0}
                  for r in by_comp[comp]]
        rank += k
    t = t0 + startup_s
    for i in range(n):
        end = t + (3 * period if i == 0 else period)
        # the first rollout starts at once and takes the warm-up's extra time
        r_start = t if i == 0 else end - rollout_s - learner_s
        for r in by_comp["rollout"]:
            lines.append(act(r, "rollout", "rollout", first_it + i, r_start, end - learner_s - r_start, rc,
                             steps=100 // len(by_comp["rollout"])))
        for r in by_comp["learner"]:
            lines.append(act(r, "learner", "update", first_it + i, end - learner_s, learner_s, rc))
        t = end
    lines.append({"ev": "attempt_end", "restart_count": rc, "time": t + 1.0, "outcome": "requeued"})
    return lines


@pytest.fixture
def resized(tmp_path: Path) -> Path:
    # Attempt 0: learner 1 + rollout 2, an iteration (100 steps) per second, iterations 0-19.
    # Queue gap: 30 s. Attempt 1: learner 2 + rollout 1, resumed at iteration 18 (18, 19 redone),
    # an iteration every 0.5 s up to 39.
    lines = attempt(0, 1000.0, 0, 20, 1.0, {"learner": 1, "rollout": 2}, 0.6, 0.3)
    end0 = lines[-1]["time"]
    lines += attempt(1, end0 + 30.0, 18, 22, 0.5, {"learner": 2, "rollout": 1}, 0.3, 0.15)
    return write(tmp_path / "run", lines, [("learner", 1), ("rollout", 2)])


def test_each_attempt_with_its_own_sizes_and_the_gaps_apart(resized: Path) -> None:
    tp = run_throughput(resized)
    assert tp.unit == "env steps"
    a0, a1 = tp.attempts
    assert (a0.sizes, a1.sizes) == ({"learner": 1, "rollout": 2}, {"learner": 2, "rollout": 1})
    assert a0.steady == pytest.approx(100.0) and a0.spread == pytest.approx((100.0, 100.0))
    assert a1.steady == pytest.approx(200.0)
    assert (a0.warmup, a0.window_iterations) == (warmup_iterations(20), window_size(20)) == (2, 2)
    assert a0.startup_s == pytest.approx(2.0) and a1.startup_s == pytest.approx(2.0)
    assert a0.queue_gap_s is None and a1.queue_gap_s == pytest.approx(30.0)
    # active: warm-up included (the first iteration takes 3 periods), start-up not
    assert a0.work == 2000 and a0.active == pytest.approx(2000 / (3.0 + 19 * 1.0))
    # whole run: iterations 0-39 once (18, 19 redone count once) over the first start to the last end
    assert tp.useful_work == 40 * 100
    start1 = 1000.0 + 2 + 22 + 1 + 30  # attempt 0's last event (attempt_end) + the 30 s gap
    assert tp.wall_s == pytest.approx(start1 + 2 + 1.5 + 21 * 0.5 - 1000.0)
    assert tp.whole_run == pytest.approx(4000 / tp.wall_s)
    assert tp.queue_gaps_s == pytest.approx(30.0) and tp.startup_s == pytest.approx(4.0)
    text = "\n".join(tp.lines())
    assert "attempt 1 [learner=2 rollout=1]: steady 200.0" in text and "queue gap 30.0s" in text
    assert "whole run:" in text and "start-up 4.0s and queue gaps 30.0s" in text


def test_a_short_attempt_has_no_steady_figure_and_says_so(tmp_path: Path) -> None:
    run = write(tmp_path / "run", attempt(0, 0.0, 0, 2, 1.0, {"learner": 1, "rollout": 1}, 0.5, 0.3),
                [("learner", 1), ("rollout", 1)])
    tp = run_throughput(run)
    assert tp.attempts[0].steady is None and tp.attempts[0].active is not None
    assert "steady: too short (2 iterations, 3 needed)" in "\n".join(tp.lines())


def test_samples_when_no_rollout_counts_env_steps(tmp_path: Path) -> None:
    lines = [{"ev": "start", "rank": 0, "component": "trainer", "restart_count": 0, "time": 0.0}]
    lines += [act(0, "trainer", "train", i, float(i), 1.0, 0, samples=32) for i in range(12)]
    tp = run_throughput(write(tmp_path / "run", lines, [("trainer", 1)]))
    assert tp.unit == "samples" and tp.attempts[0].steady == pytest.approx(32.0)


def test_tune_fits_the_newest_attempt_with_its_own_sizes(resized: Path) -> None:
    p = propose(resized, DEFAULT_PRICES)
    assert p.attempt == 1
    assert {c.name: c.ranks for c in p.current} == {"learner": 2, "rollout": 1}
    assert p.measured_steps_per_s == pytest.approx(200.0)  # the queue gap is not throughput
    assert p.whole_run_steps_per_s is not None and p.whole_run_steps_per_s < 100
    # The model: rollout 0.3 s, learner 2 x 0.15 s per 100 steps -> 333 steps/s per rank for either side
    assert p.current_steps_per_s == pytest.approx(100 / 0.3)
    assert p.calibration == pytest.approx(200 / (100 / 0.3))
    assert p.current_cost_per_m == pytest.approx(3 * 0.05 / 3600 / 200 * 1e6)


def test_tune_keeps_sizes_its_model_says_would_cost_more(tmp_path: Path) -> None:
    # learner 1 + rollout 2, rollouts 4x the learner's rank-seconds per step: within 2 cores the
    # cheapest mix (1 + 1) runs at half the pace on 2/3 of the cores, so a step would cost
    # more: keep, and say why.
    lines = attempt(0, 0.0, 0, 20, 1.0, {"learner": 1, "rollout": 2}, 0.6, 0.3)
    p = propose(write(tmp_path / "run", lines, [("learner", 1), ("rollout", 2)]), DEFAULT_PRICES, max_cores=2)
    assert p.decision == "keep" and p.cost_change == 0.0
    assert {c.name: c.ranks for c in p.proposed} == {"learner": 1, "rollout": 2}
    assert "would cost +33.3% per step" in p.reason and "--max-cores" in p.reason
    text = "\n".join(proposal_lines(p))
    assert "proposal: keep: the cheapest mix within 2 cores (learner=1, rollout=1)" in text
    assert "% cut" not in text and "(+0.0% cost)" in text, text


def test_tune_after_a_resize_proposes_from_the_new_sizes(resized: Path) -> None:
    # Attempt 1 runs learner 2 x 0.15 s + rollout 1 x 0.3 s per 100 steps: the learners idle half the
    # time, and 1 + 1 keeps the pace on 2 cores.
    p = propose(resized, DEFAULT_PRICES)
    assert p.decision == "resize" and {c.name: c.ranks for c in p.proposed} == {"learner": 1, "rollout": 1}
    assert p.cost_change == pytest.approx(2 / 3 - 1)
    assert p.predicted_steps_per_s == pytest.approx(200.0)


def test_a_cut_is_printed_as_a_cut(tmp_path: Path) -> None:
    # Rollout 3x the learner's work on 1 + 1 ranks: within 4 cores, 1 + 3 balances it.
    lines = attempt(0, 0.0, 0, 20, 1.0, {"learner": 1, "rollout": 1}, 0.9, 0.3)
    p = propose(write(tmp_path / "run", lines, [("learner", 1), ("rollout", 1)]), DEFAULT_PRICES, max_cores=4)
    assert p.decision == "resize"
    assert {c.name: c.ranks for c in p.proposed} == {"learner": 1, "rollout": 3}
    assert p.proposed_cost_per_m < p.current_cost_per_m and p.cost_change < 0
    # measured 100/s; model 111/s -> 333/s; calibrated prediction 300/s
    assert p.predicted_steps_per_s == pytest.approx(300.0)
    text = "\n".join(proposal_lines(p))
    assert f"({p.cost_change:+.1%} cost)" in text and f"{p.cost_change:+.1%}".startswith("-")
    assert "+/-0.0%" in text and "predictions below are scaled by 0.90" in text


def test_tune_prints_the_attempt_and_its_sizes(tmp_path: Path) -> None:
    lines = attempt(0, 0.0, 0, 20, 1.0, {"learner": 1, "rollout": 1}, 0.9, 0.3)
    run = write(tmp_path / "run", lines, [("learner", 1), ("rollout", 1)])
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "tune", str(run), "--max-cores", "4"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "measured, attempt 0 [learner=1 rollout=1]: steady 100 env steps/s" in out.stdout
    assert "(-33.3% cost)" in out.stdout and "proposal: resize" in out.stdout


def test_memory_is_priced_where_the_table_prices_it(tmp_path: Path) -> None:
    # Balanced ranks, 1024 MB asked, ~1 MB used: with a memory price, only memory shrinks.
    lines = attempt(0, 0.0, 0, 20, 1.0, {"learner": 1, "rollout": 1}, 0.5, 0.5)
    run = write(tmp_path / "run", lines, [("learner", 1), ("rollout", 1)])
    priced = propose(run, {**DEFAULT_PRICES, "mem_gb_hour": 0.05})
    assert priced.decision == "resize" and priced.cost_change < 0
    assert [c.mem_mb for c in priced.proposed] == [64, 64]
    free = propose(run, DEFAULT_PRICES)
    assert free.decision == "keep" and "already the cheapest" in free.reason


def test_report_status_watch_and_tune_give_the_same_figures(resized: Path) -> None:
    from hetrun.reports.live import LiveRun
    from hetrun.reports.run_report import build_report

    expected = run_throughput(resized).to_dict()
    assert build_report(resized, accounting=False).throughput == expected
    live = LiveRun.open(resized)
    live.poll()
    p = live.progress(now=2000.0)
    assert p["steps_per_s"] == expected["attempts"][-1]["steady"] == pytest.approx(200.0)
    assert (p["attempt"], p["sizes"]) == (1, {"learner": 2, "rollout": 1})
    assert p["whole_run_per_s"] == expected["whole_run"]
    assert propose(resized, DEFAULT_PRICES).measured_steps_per_s == p["steps_per_s"]
    from hetrun.cli.status_watch import run_line

    assert "200.0 steps/s steady (attempt 1: learner=2 rollout=1)" in run_line("r", "RUNNING", "", p)

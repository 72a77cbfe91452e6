"""Restart truth in `hetrun report` / `hetrun status` (issue 10, docs/CONTRACTS.md "Attempts").

Run directories written by hand with the documented event shapes (restore
with restored_state / fresh_reason, rank_failure, attempt_end), so each rule
is pinned apart from the runtime that writes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hetrun.reports.attempts import (
    count_attempts,
    counts_dict,
    counts_of_run,
    status_summary,
)
from hetrun.reports.run_report import build_report
from hetrun.runtime.attempts import attempt_counts

COMPS = (("learner", 0, "n1"), ("rollout", 1, "n2"), ("rollout", 2, "n3"))


class RunWriter:
    """Writes a run directory's events.jsonl line by line, like the runtime and batch script do."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        run_dir.mkdir(parents=True)
        (run_dir / "plan.json").write_text(json.dumps({"name": "hand", "components": [
            {"name": "learner", "nodes": 1, "cpus_per_task": 1, "gpus_per_node": 0},
            {"name": "rollout", "nodes": 2, "cpus_per_task": 1, "gpus_per_node": 0}]}))
        (run_dir / "run.json").write_text(json.dumps({"name": "hand", "job_id": "77", "backend": "sbatch"}))

    def ev(self, **e: Any) -> None:
        with (self.dir / "events.jsonl").open("a") as fh:
            fh.write(json.dumps(e, separators=(",", ":")) + "\n")

    def batch_line(self, **e: Any) -> None:
        """A line the batch script writes itself (json.dumps' default spacing, "t" for the time)."""
        with (self.dir / "events.jsonl").open("a") as fh:
            fh.write(json.dumps(e) + "\n")

    def attempt(self, restart: int, t0: float, iterations: range, *, restore: dict[str, Any] | None = None,
                work_lost: int | None = 0) -> float:
        """Start every rank at t0 (batch script 1 s earlier), restore (if given), run
        ``iterations`` (10 s each); returns the time of the last action's end."""
        for comp, rank, node in COMPS:
            self.ev(ev="start", rank=rank, component=comp, node=node, time=t0, job_id="77",
                    restart_count=restart)
            self.ev(ev="startup", rank=rank, component=comp, node=node, time=t0 + 0.5,
                    restart_count=restart, batch_start=t0 - 1, executor_ready=t0 + 0.5)
        if restore is not None:
            for comp, rank, node in COMPS:
                r = restore.get(comp, restore.get("*"))
                assert r is not None
                self.ev(ev="restore", rank=rank, component=comp, node=node, time=t0 + 1,
                        restart_count=restart, work_lost=work_lost, seconds=0.2, skipped=[], **r)
        t = t0 + 2
        for i in iterations:
            for comp, rank, node in COMPS:
                kind = "rollout" if comp == "rollout" else "optimize"
                self.ev(ev="action", type=kind, id=kind, iteration=i, rank=rank, component=comp,
                        node=node, start=t, end=t + 10, steps=10 if kind == "rollout" else 0)
            t += 10
        return t

    def end(self, restart: int, t: float, outcome: str, *, requeued: bool, code: int = 0) -> None:
        self.batch_line(ev="attempt_end", restart_count=restart, outcome=outcome, requeued=requeued,
                        exit_code=code, reason=f"test: {outcome}", t=t)

    def exits(self, t: float, code: int = 0) -> None:
        for comp, rank, node in COMPS:
            self.ev(ev="exit", rank=rank, component=comp, node=node, code=code, time=t)


def _resumed(step: int) -> dict[str, Any]:
    return {"*": {"step": step, "iteration": step, "restored_state": True}}


def _report_text(run_dir: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    return out.stdout


def test_two_preemptions_then_done(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    t = w.attempt(0, 1000, range(0, 6))  # iterations 0..5; checkpoint of iteration 4 exists
    w.end(0, t + 1, "preempted", requeued=True)
    t = w.attempt(1, t + 31, range(4, 9), restore=_resumed(4), work_lost=2)
    w.end(1, t + 2, "preempted", requeued=True)
    t = w.attempt(2, t + 12, range(8, 10), restore=_resumed(8), work_lost=1)
    w.exits(t)
    w.end(2, t + 1, "done", requeued=False)

    rep = build_report(w.dir)
    assert rep.counts == {"attempts": 3, "restarts": 2, "preemptions": 2, "time_limits": 0,
                          "failures": 0, "unknown": 0, "preemption_like": 2}
    first, second = rep.restart_history
    assert (first["cause"], first["cause_text"]) == ("preempted", "preempted")
    # queue wait: from the attempt_end (t + 1) to the next batch script start (t + 31 - 1)
    assert first["queue_wait_s"] == pytest.approx(29) and second["queue_wait_s"] == pytest.approx(9)
    # from the batch script's start (t0 - 1) to the first action's end (t0 + 12)
    assert first["first_step_s"] == pytest.approx(13)
    assert first["components"]["learner"]["state"] == "restored"
    assert first["components"]["rollout"] == {"state": "restored", "step": 4, "iteration": 4, "ranks": 2,
                                              "ranks_restored": 2, "fresh_reason": None}
    assert first["resumed_iteration"] == 4
    assert (first["work_lost_iterations"], first["work_lost_from_actions"]) == (2, 2)
    # iterations 4 and 5 of attempt 0 are redone: from iteration 4's start to the last event
    assert first["work_lost_s"] == pytest.approx(2 + 60 + 1 - (2 + 40))
    assert rep.work_lost == 3 and rep.outcome["outcome"] == "done"
    assert status_summary(w.dir) == (counts_of_run(w.dir), 3)
    text = _report_text(w.dir)
    assert "attempts 3  restarts 2 (2 preempted); work lost 3 iteration(s)" in text
    assert "learner@4 rollout@4" in text and "done (attempt 3)" in text


def test_a_component_that_restarted_fresh_is_never_reported_resumed(tmp_path: Path) -> None:
    """Issue 10's case: the learner had no checkpoints; the rollouts restored step 20."""
    w = RunWriter(tmp_path / "run")
    t = w.attempt(0, 1000, range(0, 24))
    restore = {"learner": {"step": None, "iteration": 0, "restored_state": False,
                           "fresh_reason": "component had no checkpoints (old run directory)"},
               "rollout": {"step": 20, "iteration": 20, "restored_state": True}}
    w.attempt(1, t + 5, range(20, 22), restore=restore, work_lost=None)
    rep = build_report(w.dir)
    (row,) = rep.restart_history
    assert row["cause_text"].startswith("unknown (no attempt_end")  # kill -9 + scontrol requeue
    assert row["components"]["learner"]["state"] == "fresh"
    assert row["components"]["rollout"]["state"] == "restored"
    # the learner lost everything it had done: iterations 0..23
    assert row["work_lost_iterations"] == 24 and row["work_lost_s"] == pytest.approx(240)
    assert rep.counts["unknown"] == 1 and rep.outcome["outcome"] == "running or ended without a record"
    text = _report_text(w.dir)
    assert "learner FRESH rollout@20" in text, text
    assert "learner: started fresh (component had no checkpoints (old run directory)); 0/1" in text, text
    assert "learner@" not in text


def test_a_rank_without_restored_state_makes_the_component_unconfirmed(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    t = w.attempt(0, 1000, range(0, 3))
    # rank 2 (rollout) did not confirm: the component is not "resumed at 2"
    w.attempt(1, t + 5, range(2, 3), restore={"learner": {"step": 2, "iteration": 2, "restored_state": True},
                                              "rollout": {"step": 2, "iteration": 2}})
    (row,) = build_report(w.dir).restart_history
    assert row["components"]["rollout"]["state"] == "unconfirmed"
    assert "restored_state not recorded" in row["components"]["rollout"]["fresh_reason"]


def test_a_failure_requeued_then_done_is_history_not_the_outcome(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    t = w.attempt(0, 1000, range(0, 4))
    w.batch_line(ev="rank_failure", rank=2, component="rollout", node="n3", signal="SIGKILL", exit_code=None,
                 detected_by="srun", restart_count=0, message="n3: task 1: Killed", t=t + 1)
    # a survivor's error, written after the kill, must not be blamed
    w.ev(ev="error", rank=1, component="rollout", node="n2", action="rollout", iteration=4,
         error="RuntimeFailure: waited 120s, no message arrived", time=t + 2)
    w.end(0, t + 3, "failed", requeued=True, code=9)
    t = w.attempt(1, t + 10, range(2, 5), restore=_resumed(2), work_lost=2)
    w.exits(t)
    w.end(1, t + 1, "done", requeued=False)
    rep = build_report(w.dir)
    (row,) = rep.restart_history
    assert row["cause"] == "failed" and row["detail"] == [
        "rank 2 (rollout) on n3 SIGKILL [srun]: n3: task 1: Killed"]
    assert rep.counts["failures"] == 1 and rep.counts["restarts"] == 1
    assert rep.outcome["outcome"] == "done" and rep.outcome["failures"] == []
    text = _report_text(w.dir)
    assert "done (attempt 2)" in text
    assert "restart 1: previous attempt: rank 2 (rollout) on n3 SIGKILL [srun]" in text
    assert "failed:" not in text and "waited 120s" not in text, text


def test_a_failed_last_attempt_names_the_dead_rank(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "run")
    t = w.attempt(0, 1000, range(0, 2))
    w.batch_line(ev="rank_failure", rank=0, component="learner", node="n1", signal=None, exit_code=137,
                 detected_by="mpirun", restart_count=0, message="", t=t + 1)
    w.end(0, t + 2, "failed", requeued=False, code=137)
    rep = build_report(w.dir)
    assert rep.outcome["outcome"] == "failed" and rep.restart_history == []
    assert "failed: rank 0 (learner) on n1 exit code 137 [mpirun]" in _report_text(w.dir)


def test_counting_rules() -> None:
    ends = {k: {"ev": "attempt_end", "restart_count": k, "outcome": o}
            for k, o in ((0, "preempted"), (1, "time_limit"), (3, "failed"))}
    c = count_attempts({0, 1, 2, 3, 4}, ends)
    # attempts = those that wrote attempt_end (hetrun.dag.budgets' meaning)
    assert (c.attempts, c.restarts, c.preemptions, c.time_limits, c.failures, c.unknown) == (3, 4, 1, 1, 1, 1)
    assert c.preemption_like == 3  # what preemption.max_preemptions limits
    assert count_attempts(set(), {}).restarts == 0
    # the newest attempt's missing end is not an unknown restart (it may still run)
    assert count_attempts({0}, {}).unknown == 0


def test_status_and_report_agree_on_counts(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    w = RunWriter(runs / "hand-20260101-000000-abcd")
    (w.dir / "run.json").write_text(json.dumps({"name": "hand", "job_id": None, "backend": "sbatch",
                                                 "run_dir": str(w.dir), "components": ["learner", "rollout"]}))
    t = w.attempt(0, 1000, range(0, 3))
    w.end(0, t, "preempted", requeued=True)
    t = w.attempt(1, t + 5, range(2, 4), restore=_resumed(2), work_lost=1)
    w.end(1, t, "time_limit", requeued=True)
    t = w.attempt(2, t + 5, range(3, 5), restore=_resumed(3), work_lost=1)
    rep = build_report(w.dir)
    counts, lost = status_summary(w.dir)
    assert counts_dict(counts) == rep.counts and lost == rep.work_lost == 2
    assert counts == attempt_counts(w.dir, restart_count=2)  # what the runtime's budget check counts
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "status", "--runs-dir", str(runs)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    head = [c.strip() for c in next(ln for ln in out.stdout.splitlines() if "RESTARTS" in ln).split("┃")]
    row = dict(zip(head, (c.strip() for c in next(ln for ln in out.stdout.splitlines()
                                                    if "learner" in ln).split("│")), strict=False))
    assert (row["RESTARTS"], row["PREEMPT"], row["FAILED"], row["WORK LOST"]) == ("2", "1", "0", "2"), out.stdout

"""An attempt whose batch script Slurm killed before its post-mortem ran (KillWait after a
preemption signal, the ranks' last checkpoint slow on a loaded node) left no ``attempt_end``:
the next attempt's post-mortem records it, with the outcome its own would have given (the ranks'
exit events, then the signal its batch shell marked in logs/), before counting the budgets.
Seen once in a suite run: tests/test_mixed_jobs.py's preempted run showed one attempt, not two."""

from __future__ import annotations

import json
from pathlib import Path

from hetrun.dag.budgets import Budgets
from hetrun.slurm_plugin.postmortem import (
    SIGNAL_MARK,
    TERM_EXIT_CODE,
    close_unrecorded,
    finish_attempt,
)
from hetrun.slurm_plugin.rundir import append_event, events_of


def _run_dir(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir(parents=True)
    plan = {"components": [{"name": "learner", "ntasks": 1}, {"name": "rollout", "ntasks": 1}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return tmp_path


def _start(run_dir: Path, restart: int) -> None:
    for rank, comp in enumerate(("learner", "rollout")):
        append_event(run_dir, "start", rank=rank, component=comp, node=f"n{rank + 1}", comp_rank=0,
                     restart_count=restart)


def test_a_killed_attempt_is_recorded_by_the_next_ones_post_mortem(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _start(run_dir, 0)
    (run_dir / "logs" / f"{SIGNAL_MARK}0").write_text("TERM\n")  # the trap ran; the post-mortem never did
    _start(run_dir, 1)
    for rank in (0, 1):
        append_event(run_dir, "exit", rank=rank, code=0, restart_count=1)
    requeue, end = finish_attempt(run_dir, restart=1, exit_code=0, launcher="srun", log_text="",
                                  budgets=Budgets(1, 0, "max_preemptions"))
    ends = events_of(run_dir, ("attempt_end",))
    assert [(e["restart_count"], e["outcome"]) for e in ends] == [(0, "preempted"), (1, "done")]
    assert ends[0]["signal"] == "TERM" and ends[0]["recorded_by"] == 1 and ends[0]["requeued"]
    assert "ended before its post-mortem (TERM trapped, then killed)" in ends[0]["reason"]
    assert not requeue and end["outcome"] == "done"
    assert close_unrecorded(run_dir, 2) == []  # recorded once


def test_its_outcome_comes_from_its_ranks_exits_first_and_no_trace_is_a_failure(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    _start(run_dir, 0)
    for rank in (0, 1):  # both ranks saved and exited 143 on the signal: preempted, no mark needed
        append_event(run_dir, "exit", rank=rank, code=TERM_EXIT_CODE, restart_count=0)
    _start(run_dir, 1)  # ... and attempt 1 vanished without exits or a mark (its node lost)
    _start(run_dir, 2)
    written = close_unrecorded(run_dir, 2)
    assert [(e["restart_count"], e["outcome"], e["signal"]) for e in written] == [(0, "preempted", None),
                                                                                   (1, "failed", None)]

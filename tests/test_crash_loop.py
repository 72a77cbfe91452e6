"""A job that fails the same way twice in a row, with no step done in between and no dead
node found, is not restarted again, whatever ``max_failures`` still allows (issue 25: "never
hang, say exactly what happened"). Once, inside its allocation, a job whose start-up always
failed restarted 68 times in two minutes (benchmarks/node_death.md); Megatron-LM users report a
job that looped 44 times. A restart helps after a lost node, a signal or a step done since;
it cannot help a program that fails the same way before doing anything.

The post-mortem (hetrun.slurm_plugin.postmortem) decides it for both paths: the requeue
through the queue and the in-allocation restart on spare nodes (which the batch script
starts only when the post-mortem says requeue).
"""

from __future__ import annotations

import json
from pathlib import Path

from hetrun.dag.budgets import Budgets
from hetrun.slurm_plugin.postmortem import finish_attempt
from hetrun.slurm_plugin.rundir import append_event

BUDGETS = Budgets(None, 5, "max_preemptions")
MESSAGE = "HetrunError: action components ['evaluator'] of the plan have no ranks in this MPI world of 5"


def _run_dir(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir(parents=True)
    plan = {"components": [{"name": "learner", "ntasks": 1}, {"name": "evaluator", "ntasks": 1}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return tmp_path


def _raises(run_dir: Path, restart: int, message: str = MESSAGE) -> dict:
    append_event(run_dir, "rank_failure", rank=1, component="evaluator", node="n2", signal=None, exit_code=1,
                 detected_by="runtime", restart_count=restart, message=message)
    return finish_attempt(run_dir, restart=restart, exit_code=1, launcher="srun", log_text="", budgets=BUDGETS)[1]


def test_the_same_failure_twice_with_nothing_done_between_is_not_restarted(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    first = _raises(run_dir, 0)
    assert first["requeued"] and first["failure_key"] == [f"evaluator: {MESSAGE}"], first
    # The in-allocation path found no dead node and restarted on the same nodes.
    append_event(run_dir, "node_failure", restart_count=0, dead_nodes=[], action="restart",
                 reason="no dead node identified: restarting on the same nodes")
    second = _raises(run_dir, 1)
    assert not second["requeued"], second
    assert "failed as attempt 0 did, with no step done since and no dead node: not restarted" in second["reason"]
    assert MESSAGE in second["reason"] and "hetrun resume" in second["reason"], second


def test_a_restart_that_could_help_still_happens(tmp_path: Path) -> None:
    # A step done since the last failure: the program got further; try again.
    stepped = _run_dir(tmp_path / "stepped")
    _raises(stepped, 0)
    append_event(stepped, "action", rank=0, component="learner", type="forward", id="f", iteration=7)
    assert _raises(stepped, 1)["requeued"]
    # A dead node found after the last failure: the restart runs elsewhere.
    moved = _raises(_run_dir(tmp_path / "moved"), 0)
    assert moved["requeued"]
    append_event(tmp_path / "moved", "node_failure", restart_count=0, dead_nodes=["n2"], action="restart", reason="")
    assert _raises(tmp_path / "moved", 1)["requeued"]
    # Another failure than the last one.
    other = _run_dir(tmp_path / "other")
    _raises(other, 0)
    assert _raises(other, 1, "RuntimeError: something else")["requeued"]


def test_a_signal_death_never_counts_as_the_same_failure(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    srun_log = "srun: error: n2: task 0: Killed\n"
    for restart in (0, 1, 2):
        append_event(run_dir, "start", rank=1, component="evaluator", node="n2", comp_rank=0, restart_count=restart)
        _, end = finish_attempt(run_dir, restart=restart, exit_code=137, launcher="srun", log_text=srun_log,
                                budgets=BUDGETS)
        assert end["requeued"] and "failure_key" not in end, end


def test_the_same_exit_code_from_the_launcher_counts_too(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    srun_log = "srun: error: n1: task 0: Exited with exit code 3\n"
    ends = []
    for restart in (0, 1):
        append_event(run_dir, "start", rank=0, component="learner", node="n1", comp_rank=0, restart_count=restart)
        ends.append(finish_attempt(run_dir, restart=restart, exit_code=3, launcher="srun", log_text=srun_log,
                                   budgets=BUDGETS)[1])
    assert [e["requeued"] for e in ends] == [True, False], ends
    assert ends[1]["failure_key"] == ["learner: exit code 3"], ends

"""Mixed jobs (issue 11): hetrun action components and command components in one het job.

The action components form their MPI/torch world without the command ranks (a step of
their own over their het groups); each command component is its own step. The example
examples/ppo_cartpole_mixed.yaml (PPO learner + rollout worker running actions, an
evaluator running a command that follows the learner's checkpoints) runs on the local
backend and on the local Slurm cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import spec_from_dict
from hetrun.runtime.command_rank import component_env
from hetrun.runtime.plan_view import plan_from_dict
from hetrun.runtime.world import detect_component
from hetrun.slurm_plugin.render import render_sbatch
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from setup_tools import MPIRUN

from hetrun.errors import RuntimeFailure
from tests.api_helpers import events
from tests.cli_helpers import hetrun_cli

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ppo_cartpole_mixed.yaml"
RUN_DIR = Path("/shared/runs/mixed-1")
ITERATIONS, INTERVAL = 40, 5
CHECKPOINT_STEPS = [b - 1 for b in range(INTERVAL, ITERATIONS + 1, INTERVAL)]  # 4, 9, ..., 39


def _doc(**changes: Any) -> dict[str, Any]:
    """The example's job with the evaluator run by this interpreter (the one hetrun is installed in)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["components"]["evaluator"]["command"][0] = sys.executable
    doc.update(changes)
    return doc


def _middle_command_plan() -> Any:
    """learner (actions), evaluator (command), rollout (actions): the command group sits between."""
    doc = _doc()
    comps = doc["components"]
    doc["components"] = {"learner": comps["learner"], "evaluator": comps["evaluator"],
                         "rollout": {**comps["rollout"], "tasks_per_node": 2}}
    spec = spec_from_dict(doc)
    return spec, build_plan(spec)


def test_action_ranks_are_numbered_over_the_action_het_groups_only() -> None:
    _, plan = _middle_command_plan()
    view = plan_from_dict(json.loads(plan.to_json()))
    assert [c.name for c in view.action_components] == ["learner", "rollout"]
    # What Slurm 22.05 gives a task of `srun --het-group=0 : --het-group=2` (checked on the
    # local cluster): the job's het size and per-group task counts, step ranks 0..2.
    env = {"SLURM_HET_SIZE": "3", "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "1",
           "SLURM_NTASKS_HET_GROUP_2": "2"}
    found = [detect_component({**env, "SLURM_PROCID": str(r)}, view, r, 3) for r in range(3)]
    assert [(c.name, start) for c, start in found] == [("learner", 0), ("rollout", 1), ("rollout", 1)]
    with pytest.raises(RuntimeFailure, match="outside the het groups"):
        detect_component({**env, "SLURM_PROCID": "3"}, view, 3, 4)
    with pytest.raises(RuntimeFailure, match="'evaluator' runs a command, not actions"):
        detect_component({"HETRUN_COMPONENT": "evaluator"}, view, 0, 1)
    # Event ranks: the action world's 0..2, then the command component's (never the same number).
    assert [view.first_rank(n) for n in ("learner", "rollout", "evaluator")] == [0, 1, 3]
    env = component_env({"HETRUN_COMMAND_RANK": "0"}, view, "evaluator", RUN_DIR)
    assert env["HETRUN_GLOBAL_RANK"] == "3" and env["RANK"] == "0" and env["WORLD_SIZE"] == "1"


def test_rendered_mixed_job_runs_one_action_step_and_one_step_per_command() -> None:
    spec, plan = _middle_command_plan()
    script = render_sbatch(plan, spec, RUN_DIR, python="/usr/bin/python3")
    assert script.count("#SBATCH hetjob") == 2
    action = [ln for ln in script.splitlines() if "-m hetrun.runtime " in ln]
    command = [ln for ln in script.splitlines() if "hetrun.runtime.command_rank" in ln]
    assert len(action) == 1 and len(command) == 1, script
    # The action step: both action groups, each part starting the runtime; no command group.
    parts = action[0].split(" : ")
    assert ["--het-group=0" in parts[0], "--het-group=2" in parts[1], len(parts)] == [True, True, 2]
    assert "--het-group=1" not in action[0] and "--mpi=pmix" in action[0]
    assert "--het-group=1" in command[0] and "--mpi=none" in command[0]
    assert "_hetrun_steps 2>\"$_hetrun_fifo\" &" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_plan_shows_actions_and_the_command_argv() -> None:
    out = hetrun_cli("plan", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    rows: dict[str, str] = {}
    for ln in out.stdout.splitlines():  # the first table: one row per het component
        if ln.count("│") > 6:
            rows.setdefault(ln.split("│")[2].strip(), ln)
    assert "forward, backward, sync, optimize, checkpoint" in rows["learner"]
    assert "rollout" in rows["rollout"].split("│")[-2]
    assert "command: python3 -m hetrun.examples.ppo_mixed_eval --trainer learner" in rows["evaluator"]


def _check_mixed_run(run_dir: Path, final: Any) -> dict[str, str]:
    """Every component finished, the evaluator saw every checkpoint of the learner; returns
    the node each component's rank 0 ran on."""
    evs = events(run_dir)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*")))
    assert [(c.name, c.state) for c in final.components] == [
        ("learner", "COMPLETED"), ("rollout", "COMPLETED"), ("evaluator", "COMPLETED")], logs
    saved = sorted(e["iteration"] - 1 for e in evs if e.get("ev") == "checkpoint" and e.get("component") == "learner")
    evals = [e for e in evs if e.get("component") == "evaluator" and e.get("type") == "step"]
    assert saved == CHECKPOINT_STEPS, saved
    assert [e["iteration"] for e in evals] == CHECKPOINT_STEPS, logs
    # Each evaluation is of the checkpoint it names: the policy version is the learner's
    # optimizer steps after that iteration (one per iteration).
    assert [e["metrics"]["policy_version"] for e in evals] == [s + 1 for s in CHECKPOINT_STEPS]
    assert all(0 < e["metrics"]["eval_return_mean"] <= 500 for e in evals)
    # The action world has the action ranks only: size 2 (learner + rollout), not 3.
    starts = [e for e in evs if e.get("ev") == "start" and e.get("component") in ("learner", "rollout")]
    assert sorted(e["size"] for e in starts) == [2, 2], starts
    return {e["component"]: e["node"] for e in evs if e.get("ev") == "start"}


def _check_status_and_report(run_dir: Path, *, one_attempt: bool = True) -> None:
    status = hetrun_cli("status", str(run_dir))
    report = hetrun_cli("report", str(run_dir))
    assert status.returncode == 0 and report.returncode == 0, status.stderr + report.stderr
    for comp in ("learner", "rollout", "evaluator"):
        assert any(comp in ln and "COMPLETED" in ln for ln in status.stdout.splitlines()), status.stdout
    rows = {ln.split("│")[0].strip(): ln for ln in report.stdout.splitlines() if "│" in ln}
    assert {"learner", "rollout", "evaluator"} <= set(rows), report.stdout
    if one_attempt:
        assert " attempts 1 " in report.stdout, report.stdout  # the evaluator's two start lines are one life


@pytest.mark.mpi
@pytest.mark.slow
@MPIRUN
def test_local_mixed_job_evaluates_every_learner_checkpoint(tmp_path: Path) -> None:
    from hetrun.slurm_plugin.backends.local import LocalBackend

    res = submit_spec(spec_from_dict(_doc()), backend="local", runs_dir=tmp_path / "runs")
    final = wait_for_end(res.run, LocalBackend(), timeout_s=400, poll_s=0.5)
    _check_mixed_run(Path(res.run.run_dir), final)
    _check_status_and_report(Path(res.run.run_dir))


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_mixed_job_preempted_once_both_kinds_resume(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """Preempted through ``high`` once: the action components save their agreed iteration
    and resume from it, the evaluator stops, and after the requeue evaluates only what it
    had not (its own checkpoint says how far it got): every learner checkpoint once.

    The one Slurm run of the mixed example (issue 23: an unpreempted Slurm run was run as well,
    for the checks at the end, which this run carries): each component on its own node, an
    action world of the action ranks only, each evaluation of the checkpoint it names, and
    ``hetrun status`` / ``report`` showing every component COMPLETED. The unpreempted run's
    every-checkpoint-once and single-attempt report are the local backend test's."""
    from tests.preempt_helpers import preempt_at_and_wait

    doc = _doc(slurm={"partition": "debug", "time": "00:10:00"})
    doc["workload_args"]["num_steps"] = 1024  # ~1 s iterations: time to preempt in the middle
    # 20 iterations, not the example's 40: the preemption lands after the first checkpoint (4)
    # and the evaluator's first step (iteration 11 in 2 runs at load 5-10), and checkpoints 14
    # and 19 still follow it: the evaluator resumes and evaluates what it had not.
    iterations = doc["training"]["iterations"] = 20
    checkpoint_steps = [b - 1 for b in range(INTERVAL, iterations + 1, INTERVAL)]  # 4, 9, 14, 19
    res = submit_spec(spec_from_dict(doc), backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)

    def both_working() -> bool:
        evs = events(run_dir)
        return (any(e.get("ev") == "checkpoint" and e.get("component") == "learner" for e in evs)
                and any(e.get("type") == "step" and e.get("component") == "evaluator" for e in evs))

    final = preempt_at_and_wait(res.run, shared_tmp, both_working, context=lambda: events(run_dir)[-6:], end_s=400)
    evs = events(run_dir)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((run_dir / "logs").glob("*")))
    assert [c.state for c in final.components] == ["COMPLETED"] * 3, logs
    assert [e["outcome"] for e in evs if e.get("ev") == "attempt_end"] == ["preempted", "done"], logs
    # The action ranks agreed on one iteration and both action components saved it ...
    stops = {e["component"]: e["iteration"] for e in evs if e.get("ev") == "checkpoint"
             and e.get("reason") == "preempt" and e.get("component") in ("learner", "rollout")}
    assert set(stops) == {"learner", "rollout"} and len(set(stops.values())) == 1, stops
    # ... and resumed from it, losing nothing.
    restores = [e for e in evs if e.get("ev") == "restore" and e.get("component") in ("learner", "rollout")]
    assert [(e["iteration"], e["work_lost"]) for e in restores] == [(stops["learner"], 0)] * 2, restores
    # Every checkpoint the learner committed (the agreed one included) evaluated exactly once.
    saved = sorted({e["iteration"] - 1 for e in evs if e.get("ev") == "checkpoint" and e.get("component") == "learner"})
    evaluated = [e["iteration"] for e in evs if e.get("component") == "evaluator" and e.get("type") == "step"]
    assert evaluated == saved, (evaluated, saved)
    assert set(checkpoint_steps) <= set(saved)
    # Each evaluation is of the checkpoint it names (one optimizer step per iteration).
    evals = [e for e in evs if e.get("component") == "evaluator" and e.get("type") == "step"]
    assert [e["metrics"]["policy_version"] for e in evals] == [s + 1 for s in saved], evals
    assert all(0 < e["metrics"]["eval_return_mean"] <= 500 for e in evals), evals
    # The action world has the action ranks only (size 2, not 3), in both attempts.
    starts = [e for e in evs if e.get("ev") == "start" and e.get("component") in ("learner", "rollout")]
    assert sorted(e["size"] for e in starts) == [2] * 4, starts
    # Slurm het groups: in the first allocation each component ran on its own node.
    first: dict[str, str] = {}
    for e in evs:
        if e.get("ev") == "start":
            first.setdefault(e["component"], e["node"])
    assert len(first) == 3 and len(set(first.values())) == 3, first
    _check_status_and_report(run_dir, one_attempt=False)

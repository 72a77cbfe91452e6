"""In-process mode: all components of a plan in one process, same workload code and events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hetrun.runtime.events import read_events
from hetrun.runtime.inprocess import run_inprocess
from runtime_toy import toy_plan, write_run_dir

from hetrun.errors import RunDirError, RuntimeFailure

ROOT = Path(__file__).resolve().parents[1]
# Each test is a new run in this process: no checkpoint slot (resume.py caches one per
# component and rank) may carry over from another run's store.
pytestmark = pytest.mark.usefixtures("clean_resume_hooks")


def test_toy_trains_in_process(tmp_path: Path) -> None:
    plan = toy_plan(iterations=12)
    run_dir = write_run_dir(tmp_path / "run", plan)
    res = run_inprocess(run_dir)
    assert res.exit_code == 0 and res.iterations_done == 12
    losses = [m["loss"] for m in res.metrics if m["action"] == "eval"]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0]
    events = list(read_events(run_dir))
    acts = [e for e in events if e["ev"] == "action"]
    for a in plan["actions"]:
        n = sum(1 for e in acts if e["id"] == a["id"])
        assert n == 12 // a["every"], a["id"]
    # The exact-version rule, as under MPI: rollout i (lag 2) uses the weights
    # sent at i - 2, i.e. version i - 1 (version 0 before any update).
    assert [e["policy_version"] for e in acts if e["type"] == "rollout"] == [
        max(0, i - 1) for i in range(12)]
    assert {e["ev"] for e in events} >= {"start", "action", "exit"}
    assert res.env_steps == 12 * 64


def test_workload_errors_name_component_and_action(tmp_path: Path) -> None:
    plan = toy_plan(iterations=6, workload_args={"fail_at": 2, "fail_component": "learner"})
    run_dir = write_run_dir(tmp_path / "run", plan)
    with pytest.raises(RuntimeFailure, match=r"component 'learner' failed in action forward"):
        run_inprocess(run_dir)
    errors = [e for e in read_events(run_dir) if e["ev"] == "error"]
    assert errors and errors[0]["iteration"] == 2 and "Traceback" in errors[0]["traceback"]


def test_bad_workload_reference_is_a_clear_error(tmp_path: Path) -> None:
    plan = toy_plan(iterations=1)
    plan["workload"] = "runtime_toy:NoSuchClass"
    run_dir = write_run_dir(tmp_path / "run", plan)
    with pytest.raises(RuntimeFailure, match="has no class 'NoSuchClass'"):
        run_inprocess(run_dir)


def test_missing_plan_is_a_run_dir_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"plan\.json does not exist"):
        run_inprocess(tmp_path)


def test_ppo_example_runs_in_process(tmp_path: Path) -> None:
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec

    plan = json.loads(build_plan(load_spec(ROOT / "examples" / "ppo_cartpole.yaml")).to_json())
    plan["training"]["iterations"] = 2
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps(plan))
    res = run_inprocess(run_dir)
    assert res.exit_code == 0 and res.iterations_done == 2 and res.env_steps > 0
    acts = [e for e in read_events(run_dir) if e["ev"] == "action"]
    assert {e["type"] for e in acts} >= {"rollout", "forward", "sync"}

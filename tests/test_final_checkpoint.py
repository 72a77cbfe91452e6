"""A run that completes writes a final checkpoint (issue 24), so extending it with more
iterations / steps continues from its last one: nothing redone, no "work lost".

- action components: the toy workload on real Open MPI ranks (runtime/executor.py), 5
  iterations with checkpoint.interval 4 (a boundary at 4, none at 5), then the same run
  directory with iterations 7 (what `hetrun resume RUN --set training.iterations=7` hands
  the ranks): it restores 5 and runs 5 and 6 only;
- a command script through the run API (examples/ddp_train_hetrun.py, standalone), 13 steps
  saving every 5 (after steps 4 and 9): run.close() saves step 12, and a second run with
  --steps 16 restores 13 and logs steps 13-15 only.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hetrun.runtime.ckpt import open_store
from hetrun.runtime.events import read_events
from runtime_toy import mpi_env, mpirun_cmd, toy_job_yaml, write_run_dir

from tests.api_helpers import EXAMPLE, command, events, run_once


def _toy_plan(iterations: int) -> dict:
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import spec_from_dict

    doc = json.loads(toy_job_yaml(iterations=iterations, learners=1, rollouts=1, pipeline_window=1))
    doc["components"]["learner"]["actions"].append("checkpoint")
    doc["checkpoint"] = {"interval": 4, "keep": 10}
    return json.loads(build_plan(spec_from_dict(doc)).to_json())


def _mpirun(run_dir: Path, plan: dict) -> None:
    write_run_dir(run_dir, plan)
    env = {**mpi_env(), "HETRUN_COLLECTIVE_TIMEOUT": "90"}
    proc = subprocess.run(mpirun_cmd(run_dir, plan), env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.mpi
def test_a_completed_action_run_checkpoints_its_last_iteration_and_extends_from_it(shared_tmp: Path) -> None:
    run_dir = shared_tmp / "run"
    _mpirun(run_dir, _toy_plan(5))
    first = list(read_events(run_dir))
    saved = sorted({(e["component"], e["iteration"], e["reason"]) for e in first if e["ev"] == "checkpoint"})
    assert saved == [("learner", 4, "interval"), ("learner", 5, "final"),
                     ("rollout", 4, "interval"), ("rollout", 5, "final")]

    _mpirun(run_dir, _toy_plan(7))  # the next attempt, 2 more iterations
    second = list(read_events(run_dir))[len(first):]
    restores = [e for e in second if e["ev"] == "restore"]
    assert {e["iteration"] for e in restores} == {5} and all(e.get("work_lost") == 0 for e in restores)
    ran = sorted({e["iteration"] for e in second if e["ev"] == "action"})
    assert ran == [5, 6]  # nothing redone


def test_a_completed_api_script_checkpoints_its_last_step_and_extends_from_it(shared_tmp: Path) -> None:
    run_dir, out = shared_tmp / "run", shared_tmp / "out"
    first = run_once([*command(EXAMPLE, out, 13, 1, 0.0), "--save-every", "5"], run_dir)
    assert first.returncode == 0, first.stdout
    saves = [(e["iteration"], e["reason"]) for e in events(run_dir) if e["ev"] == "checkpoint"]
    assert saves == [(5, "interval"), (10, "interval"), (13, "final")]
    assert 13 in open_store(run_dir / "ckpt" / "train").steps()

    n = len(events(run_dir))
    second = run_once([*command(EXAMPLE, out, 16, 1, 0.0), "--save-every", "5"], run_dir)
    assert second.returncode == 0, second.stdout
    later = events(run_dir)[n:]
    assert [e["iteration"] for e in later if e["ev"] == "restore"] == [13]
    assert [e["iteration"] for e in later if e["ev"] == "action"] == [13, 14, 15]  # nothing redone
    assert [(e["iteration"], e["reason"]) for e in later if e["ev"] == "checkpoint"] == [(15, "interval"), (16, "final")]


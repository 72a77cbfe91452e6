"""The PPO example with its rollout ranks reading the weights from shared windows
(runtime/shared_ring.py), under real Open MPI ranks, preempted with SIGUSR1 at two
moments and resumed, ends with exactly the checkpoint content of an uninterrupted
run: every component, every rank (learner weights, Adam moments, per-rank and
global RNG states, the rollout ranks' environments and policy, the pipeline's
saved policy versions).

PPO runs pipelined (pipeline_window 2, rollout tolerance window 1: rollout i
uses update i-2's weights) with two rollout ranks on one node that run ahead of
the learner. The uninterrupted run has no shared windows and no pause (0 s
against the preempted run's 0.25 s after each update), so the one comparison
also shows that neither the weight transport nor timing changes what is saved.

Which test carries which exact-resume claim (each proved once):

- here: the shared-weights transport across two preemptions at fixed iterations
  (every rank of every component stops at the same iteration; restores lose
  nothing);
- tests/test_resume_storm.py: both examples, unchanged transports (PPO with its
  rollout ranks on their own nodes; the MoE LM with 2 expert-parallel learner
  ranks and an evaluator), preempted 3 times through Slurm's ``high`` partition
  at random moments, against an uninterrupted run at another speed, with the
  same stop and restore checks. This file used to run those two examples under
  mpirun as well, and a second uninterrupted run at another speed; both were
  the same claims proved again (issue 23);
- tests/test_resume_exact.py: the probe workloads (supervised, and RL with the
  signal on one rank only).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from resume_compare import assert_same_checkpoints, example_spec, plan_dict
from setup_tools import MPIRUN
from test_resume_exact import events, logs_of, run_to_end

HERE = Path(__file__).parent

pytestmark = [pytest.mark.mpi, pytest.mark.slow, MPIRUN]

PPO = {"workload": "resume_slow_workloads:SlowPPO",
       "workload_args": {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32, "hidden": 16,
                         "update_epochs": 2, "num_minibatches": 2, "eval_episodes": 2},
       "components": {"rollout": {"nodes": 1, "tasks_per_node": 2}},
       "training": {"iterations": 12, "eval_interval": 4},
       "checkpoint": {"interval": 3, "keep": 10}}
PREEMPT_AFTER = [3, 7]


def make_run(root: Path, overrides: dict[str, Any], pause: float) -> Path:
    spec = example_spec("ppo_cartpole", **overrides)
    spec["workload_args"]["pause"] = pause
    plan = plan_dict(spec)
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps(plan))
    shutil.copy(HERE / "resume_slow_workloads.py", root / "resume_slow_workloads.py")
    return root


def test_ppo_with_shared_weights_preempted_twice_saves_what_an_uninterrupted_run_saves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uninterrupted = make_run(tmp_path / "uninterrupted", PPO, pause=0.0)
    assert run_to_end(uninterrupted, []) == [0], logs_of(uninterrupted)
    # The rollout ranks of the node read the weights from shared windows in the preempted run only.
    monkeypatch.setenv("HETRUN_SHARED_WEIGHTS", "1")
    preempted = make_run(tmp_path / "preempted", PPO, pause=0.25)
    assert run_to_end(preempted, PREEMPT_AFTER, timeout=180) == [85, 85, 0], logs_of(preempted)

    plan = json.loads((uninterrupted / "plan.json").read_text())
    ranks = {c["name"]: c["ntasks"] for c in plan["components"]}
    assert_same_checkpoints(uninterrupted, preempted, ranks, plan["training"]["iterations"])
    restores = [e for e in events(preempted) if e.get("ev") == "restore"]
    assert len(restores) == 2 * sum(ranks.values()), restores
    assert all(e["restored_state"] and e["work_lost"] == 0 for e in restores), restores
    # Each stop: every rank of every component checkpointed the same iteration.
    stops = {e["iteration"] for e in events(preempted) if e.get("ev") == "checkpoint" and e["reason"] == "preempt"}
    assert len(stops) == 2, stops
    shared = [e for e in events(preempted) if e.get("ev") == "shared_weights"]
    assert len(shared) == 6, shared  # 2 rollout ranks x 3 attempts
    assert not [e for e in events(uninterrupted) if e.get("ev") == "shared_weights"]

"""The Atari PPO example as a real het job on the local Slurm cluster: 2 rollout nodes, 1 learner.

A short run (3 iterations, a narrow encoder, a checkpoint): every rank
starts, every action of every iteration lands in events.jsonl, rollouts ship
uint8 frames to the learner, and the checkpoint the learner writes holds the
IMPALA weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_runtime_examples import _check_run, _submit

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ppo_atari.yaml"
OVERRIDES = ["--set", "training.iterations=3", "--set", "training.eval_interval=3",
             "--set", "checkpoint.interval=3",
             "--set", "workload_args={env_id: ALE/Frostbite-v5, num_envs: 2, num_steps: 32, impala_width: 4, "
                      "hidden: 32, eval_episodes: 2, eval_max_steps: 100}"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atari_ppo_runs_as_a_slurm_het_job(slurm_cluster: object, shared_tmp: Path) -> None:
    proc, run_dir = _submit(EXAMPLE, "sbatch", shared_tmp / "runs", OVERRIDES, timeout=400)
    events = _check_run(run_dir, proc)
    starts = [e for e in events if e["ev"] == "start"]
    assert sorted(e["component"] for e in starts) == ["learner", "rollout", "rollout"]
    assert all(e["job_id"] for e in starts)
    rollouts = [e for e in events if e["ev"] == "action" and e["type"] == "rollout"]
    assert len(rollouts) == 2 * 3 and all(e["steps"] == 2 * 32 for e in rollouts)
    # uint8 frames: 2 envs x 32 steps x 4 x 84 x 84 bytes, plus the small tensors
    assert all(2 * 32 * 4 * 84 * 84 <= e["bytes"] < 1.2 * 2 * 32 * 4 * 84 * 84 for e in rollouts)
    optimizes = [e["metrics"] for e in events if e["ev"] == "action" and "policy_version" in e.get("metrics", {})
                 and "env_steps" in e["metrics"]]
    assert [m["env_steps"] for m in optimizes] == [128.0, 256.0, 384.0]
    evals = [e["metrics"] for e in events if e["ev"] == "action" and e["type"] == "eval"]
    assert len(evals) == 1 and evals[0]["eval_episodes"] == 2
    saved = [e for e in events if e["ev"] == "checkpoint" and e["component"] == "learner"]
    assert saved and saved[-1]["iteration"] == 3

    # the run's history sizes the next one: both components, memory from the measured peaks
    tune = subprocess.run([sys.executable, "-m", "hetrun.cli", "tune", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert tune.returncode == 0, tune.stderr
    doc = json.loads(tune.stdout)
    assert [c["name"] for c in doc["current"]] == ["learner", "rollout"]
    assert [c["ranks"] for c in doc["current"]] == [1, 2]
    assert doc["proposed_cost_per_m"] <= doc["current_cost_per_m"]

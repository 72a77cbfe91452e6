"""Both examples under real Open MPI ranks, preempted with SIGUSR1 at two moments
and resumed, end with exactly the checkpoint content of an uninterrupted run:
every component, every rank (learner weights, Adam moments, per-rank and
global RNG states, the rollout ranks' environments and policy, the MoE
evaluator's model, the pipeline's saved policy versions).

PPO runs pipelined (pipeline_window 2, rollout tolerance window 1: rollout i
uses update i-2's weights) with two rollout ranks that run ahead of the
learner; the MoE LM has two expert-parallel learner ranks and an evaluator.
Two uninterrupted runs at different speeds also save identical content. The
uninterrupted pair depends only on the example and its overrides, so the two
PPO cases share one pair (module fixture): ppo-shared-weights differs from ppo
only in its preempted run.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from resume_compare import assert_same_checkpoints, example_spec, plan_dict
from setup_tools import MPIRUN
from test_resume_exact import events, logs_of, run_to_end

HERE = Path(__file__).parent

# The PPO cases share one uninterrupted pair (``uninterrupted``): one worker under pytest-xdist.
pytestmark = [pytest.mark.mpi, pytest.mark.slow, MPIRUN, pytest.mark.xdist_group("resume_exact_examples")]

PPO = {"workload": "resume_slow_workloads:SlowPPO",
       "workload_args": {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32, "hidden": 16,
                         "update_epochs": 2, "num_minibatches": 2, "eval_episodes": 2},
       "components": {"rollout": {"nodes": 1, "tasks_per_node": 2}},
       "training": {"iterations": 12, "eval_interval": 4},
       "checkpoint": {"interval": 3, "keep": 10}}
MOE = {"workload": "resume_slow_workloads:SlowMoE",
       "workload_args": {"d_model": 16, "n_layers": 1, "num_experts": 4, "num_groups": 2, "top_k": 2,
                         "seq_len": 16, "batch_size": 2, "corpus_bytes": 400000},
       "components": {"learner": {"nodes": 1, "tasks_per_node": 2}},
       "training": {"iterations": 8, "micro_batches": 2, "eval_interval": 4},
       "checkpoint": {"interval": 2, "keep": 10},
       "comms": {"forward_codec": "none", "backward_codec": "none"}}
CASES = {"ppo": ("ppo_cartpole", PPO, [2, 6]), "moe": ("moe_lm", MOE, [2, 5]),
         # The rollout ranks of the node read the weights from shared windows
         # (runtime/shared_ring.py) in the preempted run: the same versions.
         "ppo-shared-weights": ("ppo_cartpole", PPO, [3, 7])}


def make_run(root: Path, name: str, overrides: dict[str, Any], pause: float) -> Path:
    spec = example_spec(name, **overrides)
    spec["workload_args"]["pause"] = pause
    plan = plan_dict(spec)
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps(plan))
    shutil.copy(HERE / "resume_slow_workloads.py", root / "resume_slow_workloads.py")
    return root


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """(fast, slow) uninterrupted runs of a case's example and overrides, each pair run once."""
    pairs: dict[str, tuple[Path, Path]] = {}

    def get(case: str) -> tuple[Path, Path]:
        name, overrides, _after = CASES[case]
        key = json.dumps([name, overrides], sort_keys=True)
        if key not in pairs:
            root = tmp_path_factory.mktemp(case)
            fast = make_run(root / "fast", name, overrides, pause=0.0)
            assert run_to_end(fast, []) == [0], logs_of(fast)
            slow = make_run(root / "slow", name, overrides, pause=0.05)
            assert run_to_end(slow, []) == [0], logs_of(slow)
            pairs[key] = (fast, slow)
        return pairs[key]

    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_example_preempted_twice_saves_what_an_uninterrupted_run_saves(
        tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch,
        uninterrupted: Callable[[str], tuple[Path, Path]]) -> None:
    name, overrides, after = CASES[case]
    fast, slow = uninterrupted(case)  # neither run has HETRUN_SHARED_WEIGHTS: set below, for this test only
    if case.endswith("shared-weights"):
        monkeypatch.setenv("HETRUN_SHARED_WEIGHTS", "1")
    preempted = make_run(tmp_path / "preempted", name, overrides, pause=0.25)
    assert run_to_end(preempted, after, timeout=180) == [85, 85, 0], logs_of(preempted)

    plan = json.loads((fast / "plan.json").read_text())
    ranks = {c["name"]: c["ntasks"] for c in plan["components"]}
    last = plan["training"]["iterations"]
    assert_same_checkpoints(fast, slow, ranks, last)  # timing does not change what is saved
    assert_same_checkpoints(fast, preempted, ranks, last)
    restores = [e for e in events(preempted) if e.get("ev") == "restore"]
    assert len(restores) == 2 * sum(ranks.values()), restores
    assert all(e["restored_state"] and e["work_lost"] == 0 for e in restores), restores
    # Each stop: every rank of every component checkpointed the same iteration.
    stops = {e["iteration"] for e in events(preempted) if e.get("ev") == "checkpoint" and e["reason"] == "preempt"}
    assert len(stops) == 2, stops
    shared = [e for e in events(preempted) if e.get("ev") == "shared_weights"]
    assert len(shared) == (6 if case.endswith("shared-weights") else 0), shared

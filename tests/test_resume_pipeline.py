"""Exact resume of pipelined runs, in one process (fast; the MPI and Slurm
versions are test_resume_exact_examples.py and test_resume_storm.py).

Both examples, shrunk: PPO on CartPole (pipeline_window 2, rollout tolerance
window 1: rollout i runs on the weights of update i-2) and the MoE LM with an
evaluator component. A run stopped at several iterations and resumed each
time must end with the checkpoint content of an uninterrupted run, for every
component: weights, Adam moments, per-rank and global RNG, environment
state, the pipeline's saved policy versions. Also: the consumer loads the
version the rule names, and a spec with the checkpoint action on its own
component saves every component.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hetrun.runtime import resume
from hetrun.runtime.events import read_events
from hetrun.runtime.hooks import load_hooks
from hetrun.runtime.inprocess import run_inprocess
from resume_compare import assert_same_checkpoints, example_spec, plan_dict, stored

pytestmark = pytest.mark.usefixtures("clean_resume_hooks")

PPO = {"workload_args": {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32, "hidden": 16,
                         "update_epochs": 2, "num_minibatches": 2, "eval_episodes": 2},
       "training": {"iterations": 9, "eval_interval": 4},
       "checkpoint": {"interval": 3, "keep": 10}}
MOE = {"workload_args": {"d_model": 16, "n_layers": 1, "num_experts": 4, "num_groups": 2, "top_k": 2,
                         "seq_len": 16, "batch_size": 2, "corpus_bytes": 400000},
       "components": {"learner": {"nodes": 1, "tasks_per_node": 1}},
       "training": {"iterations": 8, "micro_batches": 2, "eval_interval": 4},
       "checkpoint": {"interval": 2, "keep": 10},
       "comms": {"forward_codec": "none", "backward_codec": "none"}}


def _stop_after(iteration: int) -> Any:
    """The runtime's own hooks, with a stop request once ``iteration`` ran (a preemption)."""
    hooks = load_hooks()
    hooks.should_stop = lambda ctx: ctx.iteration >= iteration
    hooks.stop_level = None
    return hooks


def run(run_dir: Path, plan: dict[str, Any], stops: list[int]) -> None:
    run_dir.mkdir(parents=True)
    for stop in [*stops, None]:
        hooks = load_hooks() if stop is None else _stop_after(stop)
        res = run_inprocess(plan, run_dir=run_dir, hooks=hooks)
        assert res.exit_code == (0 if stop is None else 85), stop
        resume.reset()


@pytest.mark.parametrize(("name", "overrides", "stops"), [
    ("ppo_cartpole", PPO, [1, 4, 5]),  # mid-interval, just past a boundary, right before one
    ("moe_lm", MOE, [2, 4]),
], ids=["ppo", "moe"])
def test_stopped_and_resumed_equals_uninterrupted(tmp_path: Path, name: str, overrides: dict[str, Any],
                                                  stops: list[int]) -> None:
    plan = plan_dict(example_spec(name, **overrides))
    last = plan["training"]["iterations"]
    run(tmp_path / "straight", plan, [])
    run(tmp_path / "stopped", plan, stops)
    ranks = {c["name"]: 1 for c in plan["components"]}
    assert_same_checkpoints(tmp_path / "straight", tmp_path / "stopped", ranks, last)
    restores = [e for e in read_events(tmp_path / "stopped") if e["ev"] == "restore"]
    assert len(restores) == len(stops) * len(ranks)
    assert all(e["restored_state"] for e in restores), restores


def test_rollout_uses_the_version_the_rule_names_and_the_producer_saves_it(tmp_path: Path) -> None:
    plan = plan_dict(example_spec("ppo_cartpole", **PPO))
    run(tmp_path / "run", plan, [4])
    rollouts = [e for e in read_events(tmp_path / "run") if e["ev"] == "action" and e["type"] == "rollout"]
    # lag 2 (tolerance window 1): rollout i uses the weights sent at i-2 = version i-1.
    assert [(e["iteration"], e["policy_version"]) for e in rollouts] == [
        (i, max(0, i - 1)) for i in range(9)]
    # The learner's checkpoint at boundary 6 carries the versions rollouts 6 and 7 need.
    learner = stored(tmp_path / "run", "learner", 0, 6)
    assert sorted({int(learner[k]) for k in learner if k.endswith("/iteration") and "/pipeline/" in k}) == [4, 5]
    rollout = stored(tmp_path / "run", "rollout", 0, 6)
    assert any(k.startswith("/workload/rollout.envs/") for k in rollout)


def test_checkpoint_action_on_its_own_component_saves_every_component(tmp_path: Path) -> None:
    spec = example_spec("ppo_cartpole", **PPO)
    spec["components"]["learner"]["actions"].remove("checkpoint")
    spec["components"]["saver"] = {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["checkpoint"]}
    plan = plan_dict(spec)
    assert {a["component"] for a in plan["actions"] if a["type"] == "checkpoint"} == {"saver"}
    run(tmp_path / "straight", plan, [])
    run(tmp_path / "stopped", plan, [4])
    for comp in ("learner", "rollout", "saver"):
        steps = sorted({e["iteration"] for e in read_events(tmp_path / "straight")
                        if e["ev"] == "checkpoint" and e["component"] == comp})
        assert steps == [3, 6, 9], (comp, steps)
    assert_same_checkpoints(tmp_path / "straight", tmp_path / "stopped", {"learner": 1, "rollout": 1}, 9)

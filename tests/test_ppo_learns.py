"""PPO really learns: CartPole-v1 and Acrobot-v1 reach gymnasium's own reward_threshold.

Slow (tens of seconds on one core). The example YAMLs run through the
runtime's in-process mode (the synchronous schedule, same workload code and
events as under MPI); a hand-driven loop checks that learning also survives
the stalest weights a pipelined plan allows.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import gymnasium as gym
import pytest
from hetrun.dag.overrides import Overrides
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.examples.ppo import PPOWorkload
from hetrun.runtime.context import RankContext
from hetrun.runtime.events import read_events
from hetrun.runtime.inprocess import run_inprocess

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def evals_inprocess(example: str, tmp_path: Path, iterations: int, eval_every: int) -> list[dict]:
    """Run an example job in process; the eval metrics in events.jsonl, in order."""
    spec = load_spec(EXAMPLES / example, Overrides(sets=[
        f"training.iterations={iterations}", f"training.eval_interval={eval_every}",
        "checkpoint.interval=0"]))
    plan = build_plan(spec)
    plan_dict = json.loads(plan.to_json())
    result = run_inprocess(plan_dict, run_dir=tmp_path)
    assert result.exit_code == 0 and result.iterations_done == iterations
    return [e["metrics"] for e in read_events(tmp_path)
            if e.get("ev") == "action" and e["type"] == "eval" and "metrics" in e]


def ctx(rank: int, component: str, seed: int) -> RankContext:
    return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                       group=None, comm=None, device="cpu", seed=seed, run_dir=Path("."),
                       mode="inprocess")


def train(env_id: str, seed: int, max_iterations: int, eval_every: int, staleness: int,
          **args: object) -> list[dict[str, float]]:
    """Iterate rollout -> forward/backward x2 -> optimize -> eval until solved; eval history."""
    learner = PPOWorkload(ctx(0, "learner", seed), env_id=env_id, **args)
    roller = PPOWorkload(ctx(1, "rollout", seed), env_id=env_id, **args)
    history = [learner.evaluate()]
    sent: deque[tuple[int, dict]] = deque()
    for it in range(max_iterations):
        sent.append((learner.version, learner.policy_state()))
        while len(sent) > staleness + 1:
            sent.popleft()
        version, weights = sent[0]  # the oldest weights the window allows
        roller.load_policy(weights, version)
        batch = roller.rollout(version)
        for micro in range(2):
            learner.backward(learner.forward(batch, micro, 2))
        learner.optimize()
        if (it + 1) % eval_every == 0:
            history.append(learner.evaluate())
            if history[-1]["solved"]:
                break
    return history


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cartpole_example_reaches_gymnasiums_reward_threshold_in_process(tmp_path: Path, clean_resume_hooks: None) -> None:
    threshold = gym.spec("CartPole-v1").reward_threshold
    evals = evals_inprocess("ppo_cartpole.yaml", tmp_path, iterations=50, eval_every=2)
    returns = [e["eval_return_mean"] for e in evals]
    assert returns[0] < 200, returns  # after one update the policy is far from it
    assert all(e["reward_threshold"] == threshold == 475.0 for e in evals)
    assert max(returns) >= threshold, returns
    assert any(e["solved"] == 1.0 for e in evals)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_acrobot_example_reaches_gymnasiums_reward_threshold_in_process(tmp_path: Path, clean_resume_hooks: None) -> None:
    threshold = gym.spec("Acrobot-v1").reward_threshold
    evals = evals_inprocess("ppo_acrobot.yaml", tmp_path, iterations=60, eval_every=3)
    returns = [e["eval_return_mean"] for e in evals]
    assert returns[0] < -300, returns  # early on it rarely swings up
    assert max(returns) >= threshold, returns


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cartpole_learns_from_rollouts_two_versions_stale() -> None:
    threshold = gym.spec("CartPole-v1").reward_threshold
    history = train("CartPole-v1", seed=0, max_iterations=150, eval_every=2, staleness=2)
    assert history[0]["eval_return_mean"] < 100  # the untrained policy is far from it
    last = history[-1]
    assert last["eval_return_mean"] >= threshold, [h["eval_return_mean"] for h in history]
    assert last["solved"] == 1.0 and last["eval_episodes"] == 20

"""PPO really learns: CartPole-v1 and Acrobot-v1 reach gymnasium's own reward_threshold.

Slow (tens of seconds on one core). The loop drives the workload in the
executor's order for a learner fed by one rollout rank whose weights may be
one version old (the pipelined plan's tolerance window).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import gymnasium as gym
import pytest
from hetrun.examples.ppo import PPOWorkload
from hetrun.runtime.context import RankContext


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
@pytest.mark.timeout(240)
def test_cartpole_reaches_gymnasiums_reward_threshold() -> None:
    threshold = gym.spec("CartPole-v1").reward_threshold
    history = train("CartPole-v1", seed=0, max_iterations=150, eval_every=2, staleness=1)
    assert history[0]["eval_return_mean"] < 100  # the untrained policy is far from it
    last = history[-1]
    assert last["reward_threshold"] == threshold == 475.0
    assert last["eval_return_mean"] >= threshold, [h["eval_return_mean"] for h in history]
    assert last["solved"] == 1.0 and last["eval_episodes"] == 20


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_acrobot_reaches_gymnasiums_reward_threshold() -> None:
    threshold = gym.spec("Acrobot-v1").reward_threshold
    history = train("Acrobot-v1", seed=0, max_iterations=150, eval_every=3, staleness=1)
    assert history[0]["eval_return_mean"] < -400  # random-ish swinging rarely gets up
    assert history[-1]["eval_return_mean"] >= threshold, [h["eval_return_mean"] for h in history]

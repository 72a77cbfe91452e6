"""PPO evaluation's cheap path measures exactly what the plain loop did (real gymnasium, real torch).

The reference below is the evaluation loop as it was before it was made cheaper: the actor as an
``nn.Sequential``, ``torch.multinomial``, gymnasium's own vector ``step`` until every first
episode ended. The shipped ``evaluate()`` must give the same returns, bit for bit, on fixed
policies: untrained (short episodes, many autoresets in the reference), a balancing one (every
episode runs to the 500-step limit), and greedy.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hetrun.examples.ppo import PPOWorkload, eval_actions
from hetrun.examples.ppo_envs import first_episode_returns, make_eval_env
from hetrun.runtime.context import RankContext


def learner(seed: int = 0, **args: object) -> PPOWorkload:
    ctx = RankContext(rank=0, world_size=1, component="learner", comp_rank=0, comp_size=1, group=None,
                      comm=None, device="cpu", seed=seed, run_dir=Path("."), mode="inprocess")
    return PPOWorkload(ctx, **args)


@torch.no_grad()
def reference_returns(w: PPOWorkload) -> np.ndarray:
    """The evaluation loop as it was (examples/ppo.py before the cheap path), kept as the oracle."""
    n = w.cfg.eval_episodes
    seed = int(np.random.SeedSequence([w.ctx.seed, 1, w.version]).generate_state(1)[0])
    gen = torch.Generator().manual_seed(seed)
    envs, obs = make_eval_env(w.cfg.env_id, n, seed % (2**31 - n))
    returns = np.zeros(n)
    running = np.ones(n, dtype=bool)
    try:
        while running.any():
            logits = w.actor(torch.as_tensor(obs, dtype=torch.float32))
            if w.cfg.eval_deterministic:
                action = logits.argmax(-1)
            else:
                action = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)
            obs, r, term, trunc, _ = envs.step(action.numpy())
            returns += r * running
            running &= ~np.logical_or(term, trunc)
    finally:
        envs.close()
    return returns


def balancing(w: PPOWorkload, gain: float) -> None:
    """Set the actor to a sharp push-toward-the-fall controller: CartPole episodes reach 500."""
    with torch.no_grad():
        linears = [m for m in w.actor if isinstance(m, torch.nn.Linear)]
        for m in linears:
            m.weight.zero_()
            m.bias.zero_()
        linears[0].weight[0] = torch.tensor([0.0, 0.0, 1.0, 0.3])  # theta + 0.3 theta_dot
        linears[0].weight[1] = torch.tensor([0.05, 0.1, 0.0, 0.0])  # drift of the cart
        linears[1].weight[0, :2] = 10.0
        linears[2].weight[1, 0] = gain  # logit of "push right"; a finite gain keeps it sampled


def check_same(w: PPOWorkload) -> dict[str, float]:
    want = reference_returns(w)
    got = w.evaluate()
    assert got["eval_return_mean"] == float(want.mean())
    assert (got["eval_return_min"], got["eval_return_max"]) == (float(want.min()), float(want.max()))
    return got


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("deterministic", [False, True])
def test_untrained_policy_same_returns(seed: int, deterministic: bool) -> None:
    w = learner(seed, eval_deterministic=deterministic)
    for version in (0, 3):
        w.version = version
        got = check_same(w)
        assert got["eval_return_max"] < 200  # short episodes: the reference auto-reset many envs


def test_balancing_policy_same_returns_to_the_limit() -> None:
    w = learner(0)
    balancing(w, gain=20.0)
    got = check_same(w)
    assert got["eval_return_max"] == 500.0 and got["solved"] == 1.0
    balancing(w, gain=1.5)  # softer: sampled actions differ from greedy ones, episodes vary
    w.version = 7
    got = check_same(w)
    assert got["eval_return_min"] < got["eval_return_max"]


def test_acrobot_takes_the_generic_path_same_returns() -> None:
    w = learner(0, env_id="Acrobot-v1", eval_episodes=3)
    envs, _ = make_eval_env("Acrobot-v1", 3, 0)
    envs.close()
    assert not isinstance(envs, gym.envs.classic_control.cartpole.CartPoleVectorEnv)
    check_same(w)


def test_sampling_matches_multinomial_draw_for_draw() -> None:
    w = learner(0)
    balancing(w, gain=1.5)
    g_ref, g_new = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    act = eval_actions(w.actor, g_new)
    obs = np.random.default_rng(0).normal(0, 0.2, size=(20, 4)).astype(np.float32)
    with torch.no_grad():
        for _ in range(5 * 64):  # whole chunks of the sampler's 64 pre-drawn steps
            probs = torch.softmax(w.actor(torch.as_tensor(obs)), -1)
            want = torch.multinomial(probs, 1, generator=g_ref).squeeze(1).numpy()
            np.testing.assert_array_equal(act(obs), want)
    assert torch.equal(g_ref.get_state(), g_new.get_state())  # 320 one-step draws = 5 chunked ones


def test_cartpole_fast_path_follows_gymnasium_step() -> None:
    """Episodes stepped by first_episode_returns end where gymnasium's own step ends them."""
    envs, obs = make_eval_env("CartPole-v1", 16, 123)
    twin, _ = make_eval_env("CartPole-v1", 16, 123)
    actions = np.random.default_rng(1).integers(0, 2, size=(600, 16))
    seen: list[np.ndarray] = []

    def act(o: np.ndarray) -> np.ndarray:
        seen.append(o.copy())
        return actions[len(seen) - 1]

    got = first_episode_returns(envs, obs, act)
    want = np.zeros(16)
    running = np.ones(16, dtype=bool)
    for t in range(len(seen)):
        np.testing.assert_array_equal(seen[t][running], (twin.state.T.astype(np.float32))[running])
        _, r, term, trunc, _ = twin.step(actions[t])
        want += r * running
        running &= ~np.logical_or(term, trunc)
    assert not running.any()
    np.testing.assert_array_equal(got, want)


def _inprocess_training(run_dir: Path, eval_interval: int) -> list[tuple[int, dict]]:
    """The shipped example (eval on its rollout component), tiny, in process: each update's metrics."""
    import json

    from hetrun.dag.overrides import Overrides
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec
    from hetrun.runtime.events import read_events
    from hetrun.runtime.inprocess import run_inprocess

    example = Path(__file__).resolve().parents[1] / "examples" / "ppo_cartpole.yaml"
    spec = load_spec(example, Overrides(sets=[
        "training.iterations=4", f"training.eval_interval={eval_interval}", "checkpoint.interval=0",
        "workload_args={env_id: CartPole-v1, num_envs: 2, num_steps: 32, hidden: 16, eval_episodes: 3}"]))
    result = run_inprocess(json.loads(build_plan(spec).to_json()), run_dir=run_dir)
    assert result.exit_code == 0 and result.iterations_done == 4
    events = [e for e in read_events(run_dir) if e.get("ev") == "action"]
    if eval_interval:
        evals = [e for e in events if e["type"] == "eval" and "metrics" in e]
        assert [(e["component"], e["iteration"]) for e in evals] == [("rollout", i) for i in range(4)]
    return [(e["iteration"], e["metrics"]) for e in events if "staleness" in e.get("metrics", {})]


def test_training_is_bit_identical_with_and_without_evaluation(tmp_path: Path, clean_resume_hooks: None) -> None:
    # Evaluation on every iteration, on the rollout rank that trains beside it (as the example
    # ships it): every update's losses, KL and returns equal those of the run without it.
    with_eval = _inprocess_training(tmp_path / "eval", eval_interval=1)
    without = _inprocess_training(tmp_path / "none", eval_interval=0)
    assert [i for i, _ in with_eval] == [0, 1, 2, 3]
    assert with_eval == without

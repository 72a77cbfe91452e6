"""``eval_spread``: an evaluation run a slice at a time inside the rollouts before the next one
(examples/ppo_spread_eval.py) gives the returns the same evaluation gives at once, of the
weights the rank held when it started; the first and the last evaluation run at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from hetrun.examples.ppo import PPOWorkload
from hetrun.runtime.context import RankContext
from test_ppo_eval import balancing, reference_returns

EVERY, ITERATIONS = 5, 20


def rollout_rank(**args: object) -> PPOWorkload:
    # A plan as the executor hands it over, reduced to what the workload reads: the eval
    # action's `every` on this component, and the run's iterations.
    plan = SimpleNamespace(iterations=ITERATIONS,
                           actions=[SimpleNamespace(type="eval", component="rollout", every=EVERY)])
    ctx = RankContext(rank=1, world_size=2, component="rollout", comp_rank=0, comp_size=1, group=None,
                      comm=None, device="cpu", seed=3, run_dir=Path("."), mode="inprocess", plan=plan)
    return PPOWorkload(ctx, num_envs=2, num_steps=16, **args)


def weights(gain: float) -> dict[str, torch.Tensor]:
    w = rollout_rank()
    balancing(w, gain)
    return {k: v.clone() for k, v in w.policy_state().items()}


def test_a_spread_evaluation_equals_the_same_evaluation_at_once() -> None:
    w = rollout_rank(eval_spread=True)
    w.load_policy(weights(1.2), version=4)
    w.rollout(4)
    w.ctx.iteration = EVERY - 1
    first = w.evaluate()  # nothing in flight: version 4 at once
    assert first["policy_version"] == 4 and w._spread is None

    w.load_policy(weights(1.5), version=5)
    w.rollout(5)  # starts the spread evaluation of the weights held now (version 5)
    spread = w._spread
    assert spread is not None and spread.version == 5 and spread.returns is None
    w.load_policy(weights(0.7), version=6)  # newer weights: the evaluation in flight keeps version 5's
    for v in (6, 7, 8):
        w.rollout(v)
    assert spread.returns is None  # a slice in each of the EVERY rollouts before the next one
    w.rollout(9)
    assert spread.returns is not None
    w.ctx.iteration = 2 * EVERY - 1
    got = w.evaluate()

    ref = rollout_rank()
    ref.load_policy(weights(1.5), version=5)
    want = reference_returns(ref)
    assert got["policy_version"] == 5
    assert got["eval_return_mean"] == float(want.mean()) and want.mean() > 100  # long episodes: sliced
    assert (got["eval_return_min"], got["eval_return_max"]) == (float(want.min()), float(want.max()))


def test_the_last_evaluation_runs_at_once_and_none_is_left_in_flight() -> None:
    w = rollout_rank(eval_spread=True)
    w.rollout(0)
    w.ctx.iteration = ITERATIONS - 1 - EVERY  # the evaluation before the run's last one
    w.evaluate()
    w.rollout(1)
    assert w._spread is None
    w.ctx.iteration = ITERATIONS - 1
    assert w.evaluate()["policy_version"] == w.version


def test_without_eval_spread_or_rollouts_nothing_is_deferred() -> None:
    plain = rollout_rank()
    plain.rollout(0)
    plain.ctx.iteration = EVERY - 1
    plain.evaluate()
    plain.rollout(1)
    assert plain._spread is None
    # A rank that evaluates but never rolls out (eval on the learner) has no rollouts to spread over.
    learner_side = rollout_rank(eval_spread=True)
    learner_side.ctx.iteration = EVERY - 1
    learner_side.evaluate()
    assert learner_side._spread_slice is None and learner_side._spread is None

"""An evaluation spread over the rollouts between two evaluations (``eval_spread: true``).

Why: the example evaluates 20 episodes every 5 updates on its first rollout rank. Once the
policy is good that is 10,000 env steps, as much env work as the training's own between two
evaluations, run in one burst inside one update: the learner waits for that update's batch,
and the pipeline loses the evaluation's whole time although the rollout rank has slack in
every update (the learner is the busier side: benchmarks/ppo.md, session 23). Spread, each
rollout after an evaluation also advances the next one by a slice of its batched steps, so
the evaluation fills the rollout rank's slack instead of stalling the learner.

What changes for the reader of the metrics: an evaluation action reports the evaluation its
rank ran since the previous one, of the weights the rank held at the first rollout after it
(``policy_version`` says which); the first evaluation of a process (a fresh run, a restart)
and the run's last one run at once, as without spreading (the last on the final weights). An evaluation of
version v gives the same returns either way: its own generator seeded by (seed, v) and the
weights copied when it starts. A preemption or a restart loses the one in flight, never any
of the training's state (it is not in the checkpoint: it shifts no training stream). The
slices run inside the rollout action, so their time shows as the rollout's in the events.
An evaluation at once (spreading off, or the first and last) is the same ``SpreadEval``
finished at once: one way to evaluate.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Generator
from typing import Any

import numpy as np
import torch


class SpreadEval:
    """One evaluation: its envs and their episodes' step generator (ppo_envs.first_episode_steps
    over a copy of the weights), advanced a slice at a time or finished at once."""

    def __init__(self, version: int, envs: Any, steps: Generator[None, None, np.ndarray],
                 slice_steps: int = 1) -> None:
        self.version = version
        self.slice_steps = max(1, slice_steps)
        self._envs, self._steps = envs, steps
        self.returns: np.ndarray | None = None

    @torch.inference_mode()
    def advance(self, steps: int | None = None) -> bool:
        """Run up to ``steps`` batched steps (default one slice); True once every episode ended."""
        if self.returns is None:
            try:
                for _ in range(self.slice_steps if steps is None else steps):
                    next(self._steps)
            except StopIteration as done:
                self.returns = done.value
                self._envs.close()
        return self.returns is not None

    def finish(self) -> np.ndarray:
        """The rest at once; the returns."""
        self.advance(sys.maxsize)
        assert self.returns is not None
        return self.returns


def slice_steps(max_episode_steps: int | None, rollouts: int) -> int:
    """Batched steps per rollout for an evaluation to end within ``rollouts`` rollouts."""
    return math.ceil((max_episode_steps or 1000) / max(1, rollouts))


def spread_gap(ctx: Any) -> int | None:
    """Iterations from this evaluation (at ``ctx.iteration``) to this component's next one when
    that one is to be spread: None when it is the run's last (it runs at once, on the final
    weights), when none is due, or when the plan does not say."""
    plan = getattr(ctx, "plan", None)
    if plan is None:
        return None
    every = [a.every for a in plan.actions if a.type == "eval" and a.component == ctx.component]
    if not every:
        return None
    gap = every[0]
    return gap if int(ctx.iteration or 0) + 2 * gap <= plan.iterations - 1 else None

"""A deterministic supervised workload for the resume tests (copied into the run dir).

Batches come from the GLOBAL python/numpy/torch generators and the model uses
dropout, so a resumed run only matches an uninterrupted one if the RNG states
are restored exactly, along with weights and AdamW moments.
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import torch
from hetrun.runtime.workload import Workload


class ResumeProbe(Workload):
    def __init__(self, ctx: Any, sleep: float = 0.0, dim: int = 32, slow_rank: int = -1) -> None:
        super().__init__(ctx)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(ctx.seed)
        random.seed(ctx.rank_seed)
        np.random.seed(ctx.rank_seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.Dropout(0.1),
                                         torch.nn.GELU(), torch.nn.Linear(64, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.01)
        self.dim = dim
        # slow_rank >= 0: only that rank of the component sleeps, so the others
        # are always ahead, already in the next iteration's gradient all-reduce
        # when a signal comes (the timing of the old stop-agreement hang).
        self.sleep = sleep if slow_rank < 0 or ctx.comp_rank == slow_rank else 0.0
        self.seen = 0

    def next_batch(self, iteration: int, micro: int) -> dict[str, torch.Tensor]:
        x = torch.randn(16, self.dim)
        noise = float(np.random.standard_normal()) * 0.01 + random.random() * 0.01
        return {"x": x, "y": x.sum(dim=1, keepdim=True) * 0.1 + noise}

    def forward(self, batch: dict[str, torch.Tensor], micro: int, num_micro: int) -> torch.Tensor:
        x = batch["x"].chunk(num_micro)[micro]
        y = batch["y"].chunk(num_micro)[micro]
        return torch.mean((self.model(x) - y) ** 2) / num_micro

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def parameters_to_sync(self) -> list[torch.Tensor]:
        return list(self.model.parameters())

    def optimize(self) -> dict[str, float]:
        self.opt.step()
        self.opt.zero_grad()
        self.seen += 1
        if self.sleep:
            time.sleep(self.sleep)
        return {"w": float(self.model[0].weight[0, 0].detach())}

    def evaluate(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])
        self.seen = int(state["seen"])


class ResumeRL(ResumeProbe):
    """The RL shape of the probe: rollout ranks sample from their global RNGs
    with the policy they hold; learner ranks each train on their own half of
    the merged batch, so the gradient all-reduce matters. Exact only if the
    rollout ranks' RNGs and the learners' weights, moments and RNGs all come
    back from the preemption checkpoint."""

    def __init__(self, ctx: Any, sleep: float = 0.0, dim: int = 32, slow_rank: int = -1,
                 rollout_sleep: float = 0.0) -> None:
        super().__init__(ctx, sleep=sleep, dim=dim, slow_rank=slow_rank)
        self.rollout_sleep = rollout_sleep

    def rollout(self, policy_version: int) -> dict[str, torch.Tensor]:
        if self.rollout_sleep:
            time.sleep(self.rollout_sleep)
        batch = self.next_batch(0, 0)
        with torch.no_grad():
            # The target depends on the weights the rollout rank holds.
            batch["y"] = batch["y"] + 0.05 * self.model.eval()(batch["x"])
        self.model.train()
        return batch

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(state)

    def forward(self, batch: dict[str, torch.Tensor], micro: int, num_micro: int) -> torch.Tensor:
        n = self.ctx.comp_size
        mine = {k: v.chunk(n)[self.ctx.comp_rank] for k, v in batch.items()}
        return super().forward(mine, micro, num_micro)

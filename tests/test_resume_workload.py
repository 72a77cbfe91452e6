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
    def __init__(self, ctx: Any, sleep: float = 0.0, dim: int = 32) -> None:
        super().__init__(ctx)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(ctx.seed)
        random.seed(ctx.rank_seed)
        np.random.seed(ctx.rank_seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.Dropout(0.1),
                                         torch.nn.GELU(), torch.nn.Linear(64, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.01)
        self.dim = dim
        self.sleep = sleep
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

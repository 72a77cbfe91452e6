"""A small LSTM over the recent demand sequence, trained on recorded runs.

One model for every series: each step of the input window carries the value
scaled by the window's mean (so busy seconds, bytes and bytes of memory share
one model), plus one-hot codes of the metric and the action type. It predicts
the next value on the same scale, trained with an L1 loss (the MAE it is
judged by). Weights are saved as JSON lists: loading executes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetrun.errors import SpecError

from .predictors import EWMA, Chooser
from .series import METRICS, DemandSeries

ACTION_TYPES = ("rollout", "forward", "backward", "sync", "optimize", "checkpoint", "eval")
WINDOW = 12
_FEATURES = 1 + len(METRICS) + len(ACTION_TYPES) + 1  # value, metric, type (+ other)


def _codes(series: DemandSeries) -> list[float]:
    metric = [float(series.metric == m) for m in METRICS]
    kinds = [float(series.action_type == k) for k in ACTION_TYPES]
    return metric + kinds + [float(series.action_type not in ACTION_TYPES)]


def _window(history: Sequence[float]) -> tuple[list[float], float]:
    recent = [float(v) for v in history[-WINDOW:]]
    recent = [recent[0]] * (WINDOW - len(recent)) + recent
    scale = sum(abs(v) for v in recent) / len(recent)
    return recent, scale if scale > 0 else 1.0


def _inputs(history: Sequence[float], series: DemandSeries) -> tuple[torch.Tensor, float]:
    recent, scale = _window(history)
    codes = _codes(series)
    rows = [[v / scale - 1.0, *codes] for v in recent]
    return torch.tensor(rows, dtype=torch.float32), scale  # [WINDOW, F]


class _Net(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(_FEATURES, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, WINDOW, F] -> [B]
        h, _ = self.lstm(x)
        return self.out(h[:, -1]).squeeze(-1)


class LSTMPredictor:
    name = "lstm"

    def __init__(self, hidden: int = 32, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.hidden = hidden
        self.net = _Net(hidden)

    def fit(self, series: Iterable[DemandSeries], warmup: int = 3, steps: int = 300,
            lr: float = 1e-2, seed: int = 0) -> float:
        """Train on every (history, next value) pair of ``series``; the final L1 loss (scaled)."""
        xs, ys = [], []
        for s in series:
            for t in range(max(1, warmup), len(s.values)):
                x, scale = _inputs(s.values[:t], s)
                xs.append(x)
                ys.append(s.values[t] / scale - 1.0)
        if not xs:
            raise SpecError("no demand history to train on", hint="record runs with a few iterations first")
        x_all, y_all = torch.stack(xs), torch.tensor(ys, dtype=torch.float32)
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        loss = torch.zeros(())
        for _ in range(steps):
            idx = torch.randint(len(x_all), (min(512, len(x_all)),), generator=gen)
            loss = (self.net(x_all[idx]) - y_all[idx]).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss.detach())

    @torch.no_grad()
    def predict(self, history: Sequence[float], series: DemandSeries) -> float:
        x, scale = _inputs(history, series)
        return float((1.0 + self.net(x.unsqueeze(0))[0]) * scale)

    # ---------------------------------------------------------------- JSON weights

    def to_json(self) -> dict[str, Any]:
        return {"kind": "hetrun.demand.lstm", "version": 1, "hidden": self.hidden, "window": WINDOW,
                "weights": {k: v.tolist() for k, v in self.net.state_dict().items()}}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LSTMPredictor:
        if doc.get("kind") != "hetrun.demand.lstm" or doc.get("window") != WINDOW:
            raise ValueError(f"not a window-{WINDOW} hetrun demand LSTM")
        model = cls(hidden=int(doc["hidden"]))
        model.net.load_state_dict({k: torch.tensor(v) for k, v in doc["weights"].items()})
        return model


def save_chooser(chooser: Chooser, path: str | os.PathLike[str]) -> None:
    """The trained LSTM and where it beat EWMA, as JSON."""
    assert isinstance(chooser.lstm, LSTMPredictor)
    doc = {"lstm": chooser.lstm.to_json(), "alpha": getattr(chooser.ewma, "alpha", 0.3),
           "use_lstm": sorted([m, t] for (m, t), use in chooser.use_lstm.items() if use)}
    Path(path).write_text(json.dumps(doc))


def load_chooser(path: str | os.PathLike[str]) -> Chooser:
    try:
        doc = json.loads(Path(path).read_text())
        chooser = Chooser(EWMA(float(doc["alpha"])), LSTMPredictor.from_json(doc["lstm"]))
        chooser.use_lstm = {(str(m), str(t)): True for m, t in doc["use_lstm"]}
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise SpecError(f"cannot load the demand model: {exc}", file=str(path),
                        hint="retrain it (benchmarks/demand_prediction.py --save PATH)") from exc
    return chooser

"""One-step-ahead demand predictors and their error on held-out runs.

Each predictor sees a series' values up to iteration t and predicts t+1.
``evaluate`` replays a series step by step (from the ``warmup``-th value on)
and reports MAE and relative error (MAE over the mean absolute actual), the
figures ``benchmarks/demand_prediction.py`` records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .series import DemandSeries


class Predictor(Protocol):
    name: str

    def predict(self, history: Sequence[float], series: DemandSeries) -> float:
        """The next value of ``series`` after ``history`` (its values so far, non-empty)."""
        ...


class LastValue:
    name = "last"

    def predict(self, history: Sequence[float], series: DemandSeries) -> float:
        return float(history[-1])


class EWMA:
    """Exponentially weighted moving average; alpha 0.3 weighs the last ~5 iterations."""

    name = "ewma"

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha

    def predict(self, history: Sequence[float], series: DemandSeries) -> float:
        level = float(history[0])
        for value in history[1:]:
            level += self.alpha * (float(value) - level)
        return level


@dataclass
class ErrorStats:
    abs_err: float = 0.0  # summed |prediction - actual|
    abs_actual: float = 0.0  # summed |actual|
    n: int = 0

    def add(self, predicted: float, actual: float) -> None:
        self.abs_err += abs(predicted - actual)
        self.abs_actual += abs(actual)
        self.n += 1

    def merge(self, other: ErrorStats) -> None:
        self.abs_err += other.abs_err
        self.abs_actual += other.abs_actual
        self.n += other.n

    @property
    def mae(self) -> float:
        return self.abs_err / self.n if self.n else float("nan")

    @property
    def relative(self) -> float:
        """MAE relative to the mean |actual| (0.1 = predictions off by 10% on average)."""
        return self.abs_err / self.abs_actual if self.abs_actual else float("nan")


def evaluate(predictor: Predictor, series: Iterable[DemandSeries], warmup: int = 3) -> ErrorStats:
    """Replay each series: predict value t from values < t, for t >= warmup."""
    stats = ErrorStats()
    for s in series:
        for t in range(max(1, warmup), len(s.values)):
            stats.add(predictor.predict(s.values[:t], s), s.values[t])
    return stats


class Chooser:
    """Per (metric, action type): the LSTM where it beat EWMA on validation series, else EWMA."""

    name = "chosen"

    def __init__(self, ewma: Predictor, lstm: Predictor | None) -> None:
        self.ewma, self.lstm = ewma, lstm
        self.use_lstm: dict[tuple[str, str], bool] = {}

    def choose(self, validation: Iterable[DemandSeries], warmup: int = 3) -> dict[tuple[str, str], bool]:
        groups: dict[tuple[str, str], list[DemandSeries]] = {}
        for s in validation:
            groups.setdefault((s.metric, s.action_type), []).append(s)
        for key, members in groups.items():
            if self.lstm is None:
                self.use_lstm[key] = False
                continue
            lstm_mae = evaluate(self.lstm, members, warmup).mae
            ewma_mae = evaluate(self.ewma, members, warmup).mae
            self.use_lstm[key] = lstm_mae < ewma_mae  # nan (too short to judge) keeps EWMA
        return self.use_lstm

    def predict(self, history: Sequence[float], series: DemandSeries) -> float:
        pick = self.lstm if self.lstm is not None and self.use_lstm.get((series.metric, series.action_type)) else self.ewma
        return pick.predict(history, series)

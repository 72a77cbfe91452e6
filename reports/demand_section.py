"""Predicted against actual demand, for `hetrun report` (issue 15).

For each component and action type, the run's per-iteration demand series
(``hetrun.reports.demand.series``: busy seconds summed over the component's
ranks, bytes moved, peak memory) is cut into windows of ``window``
iterations. Before each window, the predictor `hetrun tune` uses sees only the
iterations before it and predicts the per-iteration value; the row shows that
prediction next to the window's measured mean and the error. A series needs
at least :data:`MIN_WINDOWS` windows after the first one (the first is only
history) before the section says anything about it.
"""

from __future__ import annotations

import math
import os
from typing import Any

from hetrun.reports.demand.predictors import EWMA, ErrorStats, Predictor
from hetrun.reports.demand.series import DemandSeries, read_demand

MIN_WINDOWS = 2
_UNITS = {"busy_s": "s", "bytes": "B", "peak_mem": "B"}


def window_for(n: int) -> int:
    """About eight windows over ``n`` iterations, at least one iteration each."""
    return max(1, n // 8)


def series_rows(s: DemandSeries, predictor: Predictor, window: int) -> dict[str, Any] | None:
    """Windows of one series with prediction, measurement and error; None: too little history."""
    values = s.values
    starts = list(range(window, len(values), window))
    if len(starts) < MIN_WINDOWS:
        return None
    stats = ErrorStats()
    windows = []
    for start in starts:
        part = values[start:start + window]
        actual = sum(part) / len(part)
        predicted = float(predictor.predict(values[:start], s))
        stats.add(predicted, actual)
        windows.append({"first": s.iterations[start], "last": s.iterations[start + len(part) - 1],
                        "predicted": predicted, "actual": actual, "error": predicted - actual})
    return {"component": s.component, "action_type": s.action_type, "metric": s.metric,
            "unit": _UNITS.get(s.metric, ""), "windows": windows, "mae": _finite(stats.mae),
            "relative": _finite(stats.relative)}


def _finite(x: float) -> float | None:
    """NaN (nothing to compare with) as None: JSON has no NaN."""
    return x if math.isfinite(x) else None


def demand_section(run_dir: str | os.PathLike[str], *, predictor: Predictor | None = None,
                   window: int | None = None) -> dict[str, Any]:
    """The report's ``demand`` section: {"predictor", "window", "rows", "note"}."""
    pred = predictor or EWMA()
    demand = read_demand(run_dir)
    measured = [s for s in demand.series.values() if any(v > 0 for v in s.values)]
    n = max((len(s.values) for s in measured), default=0)
    w = window or window_for(n)
    rows = [r for s in sorted(measured, key=lambda s: s.key) if (r := series_rows(s, pred, w)) is not None]
    note = None
    if not rows:
        note = (f"no history to predict from yet: {n} iteration(s) measured, "
                f"{MIN_WINDOWS * w + 1} needed" if n else "no action was measured yet")
    return {"predictor": getattr(pred, "name", type(pred).__name__), "window": w, "rows": rows, "note": note}


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.4f}s"
    for scale, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def demand_lines(section: dict[str, Any]) -> list[str]:
    """Plain text for `hetrun report`: one line per series, its windows after it."""
    if not section:
        return []
    head = (f"demand predicted vs actual ({section['predictor']}, windows of {section['window']} "
            "iteration(s), per iteration):")
    if not section.get("rows"):
        return [f"{head} {section.get('note') or 'nothing measured'}"]
    out = [head]
    for r in section["rows"]:
        u = r["unit"]
        rel = f" ({100 * r['relative']:.1f}% of actual)" if r["relative"] is not None else ""
        out.append(f"  {r['component']}/{r['action_type']} {r['metric']}: MAE {_fmt(r['mae'], u)}{rel}")
        out.append("    " + "  ".join(
            f"it {w['first']}-{w['last']}: {_fmt(w['predicted'], u)} vs {_fmt(w['actual'], u)}"
            for w in r["windows"]))
    return out

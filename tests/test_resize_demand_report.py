"""reports/demand_section.py: predicted vs actual demand in `hetrun report`, on a hand-written
events.jsonl whose demand steps from 1 s to 2 s per iteration halfway."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hetrun.reports.demand.predictors import EWMA, LastValue
from hetrun.reports.demand_section import demand_lines, demand_section
from setup_tools import import_or_require


def write_run(run_dir: Path, iterations: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"ev": "start", "rank": 0, "component": "learner", "restart_count": 0, "time": 100.0, "node": "n1"}]
    t = 100.0
    for it in range(iterations):
        busy = 1.0 if it < 8 else 2.0
        lines.append({"ev": "action", "rank": 0, "component": "learner", "type": "optimize", "iteration": it,
                      "start": t, "end": t + busy, "time": t + busy, "peak_mem": 1000 + it})
        t += busy
    (run_dir / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_each_window_is_predicted_from_the_iterations_before_it(tmp_path: Path) -> None:
    write_run(tmp_path, 16)
    sec = demand_section(tmp_path, predictor=LastValue(), window=4)
    assert sec["predictor"] == "last" and sec["note"] is None
    (busy,) = [r for r in sec["rows"] if r["metric"] == "busy_s"]
    assert [(w["first"], w["last"]) for w in busy["windows"]] == [(4, 7), (8, 11), (12, 15)]
    assert [w["predicted"] for w in busy["windows"]] == pytest.approx([1.0, 1.0, 2.0])
    assert [w["actual"] for w in busy["windows"]] == pytest.approx([1.0, 2.0, 2.0])
    assert busy["windows"][1]["error"] == pytest.approx(-1.0)
    assert busy["mae"] == pytest.approx(1 / 3) and busy["relative"] == pytest.approx(1 / 5)
    ewma = demand_section(tmp_path, predictor=EWMA(), window=4)
    (row,) = [r for r in ewma["rows"] if r["metric"] == "busy_s"]
    assert 1.0 < row["windows"][2]["predicted"] < 2.0  # EWMA lags the step; last value does not
    text = "\n".join(demand_lines(ewma))
    assert "learner/optimize busy_s: MAE" in text and "it 8-11: 1.0000s vs 2.0000s" in text


def test_a_short_run_says_how_much_history_it_needs(tmp_path: Path) -> None:
    write_run(tmp_path, 4)
    sec = demand_section(tmp_path, window=2)
    assert sec["rows"] == [] and "4 iteration(s) measured, 5 needed" in sec["note"]
    assert "no history to predict from yet" in demand_lines(sec)[0]


def test_the_report_json_carries_the_section_and_fits_the_schema(tmp_path: Path) -> None:
    jsonschema = import_or_require("jsonschema", "jsonschema (pip, the dev extra)")
    from hetrun.reports.run_report import build_report
    from hetrun.reports.schema import REPORT_SCHEMA

    write_run(tmp_path, 24)
    (tmp_path / "run.json").write_text(json.dumps({"name": "probe", "backend": "local", "run_dir": str(tmp_path)}))
    doc = build_report(tmp_path, accounting=False).to_dict()
    text = json.dumps(doc, allow_nan=False)  # JSON without NaN
    jsonschema.validate(json.loads(text), REPORT_SCHEMA)
    assert doc["demand"]["predictor"] == "ewma" and doc["demand"]["window"] == 3
    assert all(math.isfinite(w["error"]) for r in doc["demand"]["rows"] for w in r["windows"])

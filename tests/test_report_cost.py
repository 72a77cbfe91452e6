"""Cost in `hetrun report`: the price table (validated), hours from accounting or events, waste."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.reports.cost import DEFAULT_PRICES, load_prices, run_cost
from hetrun.reports.run_report import ComponentRow
from hetrun.reports.sacct import accounting_rows

from hetrun.errors import SpecError

SAMPLE = Path(__file__).parent / "data" / "report" / "sacct_het_5.json"


def test_price_table_is_validated_with_key_paths(tmp_path: Path) -> None:
    p = tmp_path / "prices.yaml"
    p.write_text("currency: EUR\ncore_hour: 0.1\ngpu_hour: {default: 2.0, a100: 3.0}\n"
                 "partitions:\n  high: {core_hour: 0.2}\n")
    table = load_prices(p)
    assert table["currency"] == "EUR" and table["partitions"]["high"]["core_hour"] == 0.2
    p.write_text("core_hours: 0.1\n")
    with pytest.raises(SpecError, match=r"(?s)prices.yaml: core_hours: unknown key.*did you mean 'core_hour'"):
        load_prices(p)
    p.write_text("partitions:\n  high: {gpu_hour: {a100: -1}}\n")
    with pytest.raises(SpecError, match=r"partitions.high.gpu_hour.a100: must be a number >= 0"):
        load_prices(p)
    assert load_prices(None) is DEFAULT_PRICES


def test_cost_from_accounting_uses_partition_and_gres_rates() -> None:
    rows = accounting_rows(json.loads(SAMPLE.read_text()), "5", ["learner", "rollout"])
    rows[0]["tres"]["gres/gpu"] = 2  # learner: 2 GPUs for 2 s
    rows[0]["elapsed_s"] = rows[1]["elapsed_s"] = 3600  # one hour each, to read the rates off
    prices = {**DEFAULT_PRICES, "core_hour": 1.0, "gpu_hour": {"default": 10.0},
              "partitions": {"debug": {"node_hour": 0.5}}}
    comps = [ComponentRow("learner", busy_s=30, life_s=60), ComponentRow("rollout", busy_s=60, life_s=60)]
    c = run_cost(prices, rows, comps, "debug", iterations=10, env_steps=2_000_000, lost_s=10, attempts_wall_s=40)
    # learner: 1 node * 0.5 + 1 cpu * 1.0 + 2 GPUs * 10; rollout: 2 nodes * 0.5 + 2 cpus * 1.0
    assert c["components"]["learner"]["cost"] == pytest.approx(21.5)
    assert c["components"]["rollout"]["cost"] == pytest.approx(3.0)
    assert c["total"] == pytest.approx(24.5) and c["per_iteration"] == pytest.approx(2.45)
    assert c["per_million_env_steps"] == pytest.approx(12.25)
    assert c["source"] == "slurm accounting"
    assert c["wasted_restarts_share"] == 0.25 and c["wasted_idle_share"] == 0.25
    assert c["wasted_share"] == pytest.approx(0.25 + 0.75 * 0.25)


def test_cost_falls_back_to_event_hours() -> None:
    comps = [ComponentRow("learner", core_hours=2.0, gpu_hours=1.0, node_hours=1.0, busy_s=1, life_s=1)]
    c = run_cost(DEFAULT_PRICES, [], comps, None, iterations=0, env_steps=0, lost_s=0, attempts_wall_s=0)
    assert c["total"] == pytest.approx(2 * 0.05 + 2.5) and c["per_iteration"] is None
    assert c["source"].startswith("events")


def test_cli_bad_price_table_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text('{"ev":"start","rank":0,"component":"c","node":"n","time":1}\n')
    bad = tmp_path / "p.yaml"
    bad.write_text("gpu_hour: lots\n")
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(tmp_path), "--prices", str(bad)],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "p.yaml: gpu_hour: must be a number >= 0, got 'lots'" in out.stderr, out.stderr


def test_a_small_amount_keeps_its_digits_zero_stays_zero() -> None:
    from hetrun.cli.report_cmd import _amount

    assert [_amount(v) for v in (0.0, 0.0012, 0.00030, 3.04e-05, 1.5e-07, 22.0486)] == [
        "0.0000", "0.0012", "0.0003", "0.0000304", "0.000000150", "22.0486"]

"""Checkpoint history in `hetrun report`: a real store written by the real writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from hetrun.reports.run_report import build_report
from hetrun.runtime.ckpt import tiers_for
from hetrun.runtime.ckpt.writer import CheckpointWriter


def _ev(run_dir: Path, **e: object) -> None:
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write(json.dumps(e) + "\n")


def _run_with_store(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps({"name": "ck", "components": [{"name": "learner"}]}))
    w = CheckpointWriter(tiers_for(run_dir / "ckpt" / "learner"), chunk_bytes=1 << 16, keep=2)
    gen = torch.Generator().manual_seed(0)
    frozen = torch.randn(1 << 15, generator=gen)  # unchanged between saves: stored once
    t = torch.randn(1 << 15, generator=gen)
    _ev(run_dir, ev="start", rank=0, component="learner", node="n1", time=100.0, restart_count=0)
    for step in (10, 20, 30):
        t = t + 1e-2 * torch.randn(1 << 15, generator=gen)
        stall = w.save(step, {"t": t, "frozen": frozen}, {"reason": "interval"})
        assert w.wait().ok  # type: ignore[union-attr]
        _ev(run_dir, ev="checkpoint", rank=0, component="learner", node="n1", iteration=step,
            reason="interval", start=100.0 + step, end=100.1 + step, time=100.1 + step,
            info={"step": step, "stall_s": stall})
    w.close()
    _ev(run_dir, ev="start", rank=0, component="learner", node="n1", time=200.0, restart_count=1)
    _ev(run_dir, ev="restore", rank=0, component="learner", node="n1", time=201.0, restart_count=1,
        step=30, iteration=30, restored_state=True, work_lost=0, seconds=0.01)


def test_every_checkpoint_with_its_bytes_ratio_and_what_verified_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run_with_store(run_dir)
    rows = build_report(run_dir).checkpoint_history["rows"]
    assert [(r["step"], r["in_store"]) for r in rows] == [(10, False), (20, True), (30, True)]
    pruned, second, third = rows
    assert "pruned" in pruned["error"] and pruned["state_bytes"] is None
    full = 2 * (1 << 15) * 4  # two fp32 tensors
    assert second["state_bytes"] == third["state_bytes"] == full
    # 30's frozen tensor is referenced, not rewritten: it adds well under half the state
    assert 0 < third["stored_bytes"] < full / 2 and third["ratio"] < 0.5
    assert third["tiers"] and third["save_s"] >= third["stall_s"] >= 0
    assert (second["verified"], third["verified"]) == ("-", "restored")
    verified = build_report(run_dir, verify_checkpoints=True).checkpoint_history["rows"]
    assert [r["verified"] for r in verified] == ["-", "ok", "ok"]
    # The store is listed without torch (its import was 3 of the 4 s a report took on the demo run).
    probe = ("import sys\nfrom hetrun.cli.entry import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    assert not e.code, e.code\nprint('TORCH=' + str('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, "report", str(run_dir), "--checkpoints"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "checkpoints" in out.stdout and "restored" in out.stdout and "pruned by checkpoint.keep" in out.stdout
    assert out.stdout.rstrip().endswith("TORCH=False"), out.stdout[-300:]


def test_no_store_is_a_note_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text('{"ev":"start","rank":0,"component":"c","node":"n","time":1}\n')
    hist = build_report(tmp_path).checkpoint_history
    assert hist["rows"] == [] and "no checkpoint store under" in hist["notes"][0]

"""What `hetrun report` shows first (issue 24): the outcome before where the time went, one
screen by default, the long sections behind flags, --json keeping everything; a command that
logs no steps is never called idle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_report_render import _recorded_run
from test_report_restarts import RunWriter


def _report(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_default_report_leads_with_the_outcome_and_fits_one_screen(tmp_path: Path) -> None:
    run_dir = _recorded_run(tmp_path)
    lines = _report(str(run_dir)).splitlines()
    assert len(lines) <= 40, "\n".join(lines)
    assert lines[0].startswith("run hand") and lines[1] == "done (attempt 2)"
    assert [ln.split(" ")[0].rstrip(":") for ln in lines[2:6]] == ["result", "throughput", "wasted", "wall"]
    heads = [i for i, ln in enumerate(lines) if ln.strip() in ("components", "restarts")]
    assert heads and min(heads) > 5  # where the time went comes after the outcome
    assert not any(ln.strip() in ("ranks", "checkpoints", "resources (sampled)") for ln in lines)
    assert lines[-1].startswith("more: --ranks, --checkpoints")

    everything = _report(str(run_dir), "--all").splitlines()
    assert {"ranks", "checkpoints"} <= {ln.strip() for ln in everything} and len(everything) > len(lines)
    doc = json.loads(_report(str(run_dir), "--json"))
    assert doc["checkpoint_history"]["rows"] and doc["ranks"] and "demand" in doc and doc["headline"]["status"] == "done"
    assert doc["checkpoint_history"]["summary"]["learner"]["count"] == 1


def _command_run(root: Path, name: str, component: str) -> RunWriter:
    """A local run of one single-rank command component, started at t=1000."""
    w = RunWriter(root / "run")
    (w.dir / "plan.json").write_text(json.dumps({"name": name, "components": [
        {"name": component, "nodes": 1, "tasks_per_node": 1, "ntasks": 1, "command": ["python3", "x.py"]}]}))
    (w.dir / "run.json").write_text(json.dumps({"name": name, "job_id": "local-1", "backend": "local"}))
    w.ev(ev="start", rank=0, component=component, node="n1", time=1000.0, restart_count=0, command=True)
    return w


def test_a_command_that_logs_no_steps_is_not_called_idle(tmp_path: Path) -> None:
    w = _command_run(tmp_path, "quiet", "main")
    w.ev(ev="exit", rank=0, component="main", node="n1", time=1060.0, code=0)
    w.batch_line(ev="attempt_end", restart_count=0, outcome="done", requeued=False, exit_code=0, t=1061.0)
    text = _report(str(w.dir))
    assert "idle inside the allocation" not in text and "100.0%" not in text, text
    assert "idle time not measured: main log no steps" in text, text
    assert "main: no steps logged (the program does not call run.log)" in text, text
    assert "actions 0" not in text and "env steps" not in text, text
    doc = json.loads(_report(str(w.dir), "--json"))
    assert doc["cost"]["idle_unmeasured"] == ["main"] and doc["cost"]["wasted_share"] == 0.0


def test_a_command_job_that_logs_steps_is_reported_in_steps(tmp_path: Path) -> None:
    w = _command_run(tmp_path, "ddp", "trainer")
    for step in range(4):  # what the run API writes for each run.log(step, loss=...)
        w.ev(ev="action", rank=0, component="trainer", node="n1", type="step", id="step", iteration=step,
             start=1000.0 + 10 * step, end=1010.0 + 10 * step, metrics={"loss": 4.0 - step}, time=1010.0 + 10 * step)
    w.ev(ev="exit", rank=0, component="trainer", node="n1", time=1041.0, code=0)
    w.batch_line(ev="attempt_end", restart_count=0, outcome="done", requeued=False, exit_code=0, t=1042.0)
    lines = _report(str(w.dir)).splitlines()
    text = "\n".join(lines)
    assert lines[1] == "done" and lines[2] == "result: loss 1 at step 3", text
    assert "work: trainer 4 steps logged (last step 3: loss=1)" in text, text
    cost = next(ln for ln in lines if ln.startswith("cost "))
    assert " USD/step " in cost and "iteration" not in text and "actions 0" not in text, text

"""The rendered report: a golden rendering of a recorded run directory at a fixed width (200
columns, what `hetrun report` uses when stdout is not a terminal), the per-rank timeline, --vs.

Regenerate the golden file after an intended change with
``HETRUN_UPDATE_GOLDEN=1 pytest tests/test_report_render.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hetrun.reports.timeline_view import timeline_rows
from test_report_restarts import RunWriter, _resumed

GOLDEN = Path(__file__).resolve().parent / "golden" / "report_restarted.txt"


def _recorded_run(root: Path) -> Path:
    """Two attempts: a rollout rank killed (requeued as a failure), then a resume to the end."""
    w = RunWriter(root / "run")
    (w.dir / "run.json").write_text(json.dumps({"name": "hand", "job_id": "local-1", "backend": "local"}))
    t = w.attempt(0, 1000, range(0, 4))
    w.ev(ev="checkpoint", rank=0, component="learner", node="n1", iteration=2, time=1025.0, start=1025.0,
         end=1025.0, reason="interval", info={"step": 2, "stall_s": 0.012})
    w.batch_line(ev="rank_failure", rank=2, component="rollout", node="n3", signal="SIGKILL", exit_code=None,
                 detected_by="mpirun", restart_count=0, message="rank 2 killed", t=t + 1)
    w.end(0, t + 2, "failed", requeued=True, code=9)
    t = w.attempt(1, t + 10, range(2, 6), restore=_resumed(2), work_lost=2)
    w.exits(t)
    w.end(1, t + 1, "done", requeued=False)
    return w.dir


def _render(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", *args], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_golden_rendering_of_a_recorded_run(tmp_path: Path) -> None:
    run_dir = _recorded_run(tmp_path)
    text = _render(str(run_dir)).replace(str(run_dir), "<RUN>")
    if os.environ.get("HETRUN_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_timeline_rows_show_types_idle_and_marks(tmp_path: Path) -> None:
    tl = {"origin": 0.0, "bucket_s": 1.0, "buckets": 10, "ranks": {
        "0": {"busy": {"rollout": [1, 1, 1, 0, 0, 0, 0.3, 0, 0, 0]}, "marks": [[5.0, "checkpoint"]]},
        "1": {"busy": {"optimize": [0, 0, 0, 1, 1, 0, 0, 0, 0, 1]}, "marks": [[0.0, "start"], [9.5, "error"]]}}}
    rows = [line.plain for line in timeline_rows(tl, {0: "0 rollout", 1: "1 learner"}, width=20)]
    assert rows[1] == "0 rollout ███··C▄···"  # busy, idle, a checkpoint, partly busy (0.3 s of 1)
    assert rows[2] == "1 learner |··██····X"
    assert "█ optimize" in rows[0] and "█ rollout" in rows[0]
    assert timeline_rows({"buckets": 0}, {}, 80)[0].plain == "timeline: no actions yet"


def test_vs_puts_two_runs_side_by_side(tmp_path: Path) -> None:
    a = _recorded_run(tmp_path / "a")
    b = RunWriter(tmp_path / "b" / "run")
    b.attempt(0, 1000, range(0, 6))
    for run, cpu in ((a, 40.0), (b.dir, 80.0)):  # one resource sample each: utilization side by side
        with (run / "events.jsonl").open("a") as fh:
            fh.write(json.dumps({"ev": "sample", "rank": 0, "component": "learner", "node": "n1", "time": 1001.0,
                                 "cpu_pct": cpu, "rss": 1000}) + "\n")
    doc = json.loads(_render(str(a), "--vs", str(b.dir), "--json"))
    rows = {r["metric"]: r for r in doc["rows"]}
    assert rows["restarts"]["a"] == 1 and rows["restarts"]["b"] == 0
    assert rows["iterations"]["a"] == rows["iterations"]["b"] == 6 and rows["iterations"]["ratio"] == 1.0
    # the uninterrupted run needs 6 x 10 s; the restarted one redid 2 iterations and waited in between
    assert rows["wall"]["ratio"] < 1 and rows["work lost"]["a"] == 2
    assert rows["CPU (samples, mean)"]["ratio"] == 2.0 and rows["GPU util (samples, mean)"]["a"] is None
    text = _render(str(a), "--vs", str(b.dir))
    assert "B/A" in text and "learner: s / iteration" in text

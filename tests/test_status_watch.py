"""`hetrun status --watch` on a real local-backend run: plain lines when piped, a live rich view in a
real terminal (tmux: progress advances, Ctrl-C ends it cleanly), and the incremental event reader."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.reports.live import LiveRun
from hetrun.slurm_plugin.backends.local import LocalBackend
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from setup_tools import TMUX

HERE = Path(__file__).parent


def _probe_run(tmp_path: Path, iterations: int, sleep: float, env: dict[str, str] | None = None) -> object:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "resume_workload.py").write_text((HERE / "test_resume_workload.py").read_text())
    spec = spec_from_dict({
        "name": "watch-probe", "workload": "resume_workload:ResumeProbe", "workload_args": {"sleep": sleep},
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": iterations, "micro_batches": 1, "pipeline_window": 1,
                     "seed": 1},
        "checkpoint": {"interval": 4, "keep": 2},
        "env": {"OMP_NUM_THREADS": "1", "HETRUN_JOB_DIR": str(job_dir), **(env or {})},
    })
    return submit_spec(spec, backend="local", runs_dir=tmp_path / "runs")


def test_live_reader_reads_only_complete_appended_lines(tmp_path: Path) -> None:
    # The live view reads plan.json through the runtime's one reader (load_plan): a real plan's shape.
    (tmp_path / "plan.json").write_text(json.dumps({"components": [{"name": "c"}], "training": {"iterations": 10}}))
    ev = tmp_path / "events.jsonl"
    ev.write_text('{"ev":"action","type":"optimize","iteration":0,"start":0,"end":1,"rank":0,'
                  '"metrics":{"loss":0.5}}\n{"ev":"action","type":"opt')
    live = LiveRun.open(tmp_path)
    assert live.poll() and live.iteration == 0
    with ev.open("a") as fh:  # the torn line completes, two more arrive
        fh.write('imize","iteration":1,"start":1,"end":2,"rank":0}\n'
                 '{"ev":"checkpoint","iteration":2,"time":2.5,"info":{"step":2}}\n'
                 '{"ev":"action","type":"optimize","iteration":2,"start":2,"end":3,"rank":0}\n')
    assert live.poll() and not live.poll()
    p = live.progress(now=5.0)
    assert (p["iterations_done"], p["total"], p["fraction"]) == (3, 10, 0.3)
    assert p["iterations_per_s"] == pytest.approx(1.0) and p["eta_s"] == pytest.approx(7.0)
    assert (p["checkpoint_step"], p["checkpoint_age_s"]) == (2, 2.5) and p["metrics"]["loss"] == 0.5


@pytest.mark.slow
def test_watch_prints_plain_lines_until_the_run_ends(tmp_path: Path) -> None:
    res = _probe_run(tmp_path, iterations=16, sleep=0.3)
    run_dir = str(res.run.run_dir)  # type: ignore[attr-defined]
    try:
        out = subprocess.run([sys.executable, "-m", "hetrun.cli", "status", "--watch", "--interval", "0.3",
                              run_dir], capture_output=True, text=True, timeout=240)
    finally:
        subprocess.run([sys.executable, "-m", "hetrun.cli", "cancel", run_dir], capture_output=True, check=False)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("watch-probe")]
    done = [int(ln.split(" it ")[1].split("/")[0]) for ln in lines]
    assert len(set(done)) >= 3 and done == sorted(done), out.stdout  # progress advanced, line by line
    assert "it 16/16" in lines[-1] and "COMPLETED" in lines[-1], out.stdout
    # the last checkpoint with its age and the bytes it added to the store
    assert re.search(r"ckpt 16 \(\d+:\d\d:\d\d ago, [\d.]+ (B|KiB|MiB)\)", lines[-1]), lines[-1]
    assert "\x1b[" not in out.stdout  # no terminal control codes when piped


@pytest.mark.slow
@TMUX
def test_watch_in_a_real_terminal_advances_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    res = _probe_run(tmp_path, iterations=400, sleep=0.2)
    run_dir = str(res.run.run_dir)  # type: ignore[attr-defined]
    session = "watch"
    # A private server on a socket in this test's directory: nothing another test or a /tmp clean-up
    # does to /tmp/tmux-UID can end it or hide it.
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    # The pane's environment without COLUMNS/LINES: pytest's process carries COLUMNS=80 LINES=24 in its
    # C-level environment (os.environ does not show them), which a child started with env=None inherits; rich
    # prefers to the terminal's real size, so the table was cut to 80 columns and ITER never showed.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    cmd = f"{sys.executable} -m hetrun.cli status --watch --interval 0.3 {run_dir}; echo WATCH-EXIT=$?; sleep 30"
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "220", "-y", "20", cmd, ";",
                    "set-option", "remain-on-exit", "on"], check=True, env=env, stdin=subprocess.DEVNULL)

    def pane() -> str:
        out = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True)
        return out.stdout or out.stderr

    def iteration(text: str) -> int | None:
        for line in text.splitlines():
            if "watch-probe" in line and "/400" in line:
                return int(line.split("/400")[0].split()[-1])
        return None

    try:
        seen = []
        deadline = time.time() + 180
        while time.time() < deadline and len({s for s in seen if s}) < 3:
            seen.append(iteration(pane()))
            time.sleep(0.5)
        progress = [s for s in seen if s is not None]
        assert len(set(progress)) >= 3 and progress == sorted(progress), (seen, pane())
        assert "PROGRESS" in pane() and "░" in pane()  # the bar (its full part is 0 blocks at <2.5%)
        subprocess.run([*tmux, "send-keys", "-t", session, "C-c"], check=True)
        deadline = time.time() + 20
        while time.time() < deadline and "WATCH-EXIT=" not in pane():
            time.sleep(0.3)
        text = pane()
        assert "WATCH-EXIT=0" in text and "watch stopped" in text and "Traceback" not in text, text
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)
        subprocess.run([sys.executable, "-m", "hetrun.cli", "cancel", run_dir], capture_output=True, check=False)
        wait_for_end(res.run, LocalBackend(), timeout_s=60, poll_s=0.5)  # type: ignore[attr-defined]

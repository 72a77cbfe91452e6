"""A command component that ignores the stop (runtime/command_stop.py), on the local backend.

A script that uses the run API for steps and checkpoints but never asks
``should_stop``, and a script without the API that handles the warning itself:
``hetrun preempt`` warns it, the rank's wrapper waits the API's budget, ends it
at the hard deadline and writes a ``stop_ignored`` line; the attempt's end,
``hetrun status`` and ``hetrun report`` name the component, rank and reason and
the work lost. And each stop signal reaches the program once: the local
supervisor signals the wrapper's whole process group, the wrapper forwards only
a signal sent to it alone (a user's ``kill`` of its pid)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from hetrun.runtime.command_stop import work_lost
from hetrun.slurm_plugin.rundir import events_of, wait_for

from tests.cli_helpers import hetrun_cli, write_job

# Uses the run API for its steps and checkpoints, never for the stop.
IGNORES_THE_STOP = """
import sys, time
import torch
import hetrun

steps, every = int(sys.argv[1]), int(sys.argv[2])
run = hetrun.attach(checkpoint_every=every)
w = torch.zeros(4)
start = run.restore({"w": w})
for step in range(start, steps):
    time.sleep(0.05)
    w += 1
    run.log(step, w=float(w[0]))
    if run.checkpoint_due(step):
        run.save(step, {"w": w}, wait=True)
run.close()
print("finished", float(w[0]), flush=True)
"""

# No run API: counts the signals it gets (and from whom) in a file, and keeps running.
COUNTS_SIGNALS = """
import json, os, signal, sys, time

out = sys.argv[1]
sigs = {signal.SIGUSR1, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
with open(out, "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "wrapper": os.getppid()}) + "\\n")
while True:
    info = signal.sigtimedwait(sigs, 60)
    if info is not None:
        with open(out, "a") as f:
            f.write(json.dumps({"sig": signal.Signals(info.si_signo).name, "from": info.si_pid}) + "\\n")
"""


def _submit(tmp: Path, name: str, argv: list[str], preemption: dict[str, Any]) -> tuple[Path, Path]:
    job_dir, runs = tmp / "job", tmp / "runs"
    job_dir.mkdir(parents=True, exist_ok=True)
    doc = {"name": name, "components": {"trainer": {"nodes": 1, "tasks_per_node": 1, "mem": "1G", "command": argv}},
           "preemption": preemption, "env": {"OMP_NUM_THREADS": "1"}}
    proc = hetrun_cli("submit", str(write_job(job_dir, doc)), "--backend", "local", "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")))
    return run_dir, runs


def _script(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def _steps(run_dir: Path) -> list[int]:
    return [e["iteration"] for e in events_of(run_dir, ("action",)) if e.get("type") == "step"]


def _preempt(run_dir: Path, runs: Path) -> None:
    proc = hetrun_cli("preempt", str(run_dir), "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _ends(run_dir: Path, n: int) -> list[dict[str, Any]]:
    assert wait_for(lambda: len(events_of(run_dir, ("attempt_end",))) >= n, 120, 0.3), \
        events_of(run_dir, ("start", "exit", "stop_signal", "stop_ignored", "attempt_end"))
    return events_of(run_dir, ("attempt_end",))


def test_script_without_a_checkpoint_ignoring_the_stop_is_ended_at_the_deadline_and_named(tmp_path: Path) -> None:
    script = _script(tmp_path, "ignore.py", IGNORES_THE_STOP)
    # grace 6 s: the API's budget is 1 s after USR1 and the wrapper's 1 + 3 s; no requeue.
    run_dir, runs = _submit(tmp_path, "ignores-stop", [sys.executable, script, "100000", "0"],
                            {"grace_seconds": 6, "max_preemptions": 0})
    try:
        assert wait_for(lambda: len(_steps(run_dir)) >= 10, 120, 0.2), "no steps logged"
        _preempt(run_dir, runs)
        [end] = _ends(run_dir, 1)
    finally:
        hetrun_cli("cancel", str(run_dir), "--runs-dir", str(runs), timeout=60)
    [signalled] = events_of(run_dir, ("stop_signal",))
    [ignored] = events_of(run_dir, ("stop_ignored",))
    assert signalled["signal"] == "USR1" and signalled["forwarded"] is False, signalled
    assert ignored["signal"] == "USR1" and ignored["component"] == "trainer" and ignored["rank"] == 0, ignored
    # Delivered, then ignored for the whole budget (1 s + the 3 s margin), then killed.
    assert ignored["ignored_s"] >= ignored["deadline_s"] == 4.0, ignored
    assert ignored["delivered_at"] == pytest.approx(signalled["time"], abs=0.5)
    last = max(_steps(run_dir))
    assert ignored["last_step"] == last and ignored["work_lost_steps"] == last + 1, (ignored, last)
    assert ignored["work_lost"] == f"all {last + 1} steps: no checkpoint"
    [exit_] = [e for e in events_of(run_dir, ("exit",)) if e.get("command")]
    assert exit_["code"] == 85 and exit_["stop_ignored"] is True and exit_["forwarded"] == [], exit_
    reason = end["reason"]
    assert end["outcome"] == "time_limit" and not end["requeued"] and end["stop_ignored"] == [0], end
    assert "rank 0 (trainer)" in reason and "ignored the stop signal (SIGUSR1) for" in reason, reason
    assert "killed at the hard deadline" in reason and f"all {last + 1} steps: no checkpoint" in reason, reason

    status = hetrun_cli("status", str(run_dir), "--runs-dir", str(runs))
    assert "ignored the stop signal" in status.stdout and "no checkpoint" in status.stdout, status.stdout
    report = hetrun_cli("report", str(run_dir), "--runs-dir", str(runs))
    assert report.returncode == 0, report.stderr
    assert "rank 0 (trainer)" in report.stdout and f"work lost: all {last + 1} steps" in report.stdout, report.stdout


def test_work_lost_since_the_last_checkpoint_matches_the_restore_after_the_requeue(tmp_path: Path) -> None:
    script = _script(tmp_path, "ignore.py", IGNORES_THE_STOP)
    run_dir, runs = _submit(tmp_path, "ignores-stop-ckpt", [sys.executable, script, "130", "25"],
                            {"grace_seconds": 6})
    try:
        assert wait_for(lambda: len(_steps(run_dir)) >= 10, 120, 0.2), "no steps logged"
        _preempt(run_dir, runs)
        ends = _ends(run_dir, 2)
    finally:
        hetrun_cli("cancel", str(run_dir), "--runs-dir", str(runs), timeout=60)
    [ignored] = events_of(run_dir, ("stop_ignored",))
    ckpts = [e["iteration"] for e in events_of(run_dir, ("checkpoint",)) if e["time"] < ignored["time"]]
    assert ckpts, "no checkpoint before the kill (raise the step count)"
    assert ignored["last_checkpoint_step"] == max(ckpts) - 1, (ignored, ckpts)
    lost = ignored["work_lost_steps"]
    assert ignored["work_lost"] == f"{lost} steps since its last checkpoint (step {max(ckpts) - 1})", ignored
    assert [e["outcome"] for e in ends] == ["time_limit", "done"] and ends[0]["requeued"], ends
    # The requeued attempt restored that checkpoint and the report counts the same steps lost.
    [restore] = [e for e in events_of(run_dir, ("restore",)) if e.get("restart_count") == 1]
    assert restore["iteration"] == max(ckpts), restore
    report = json.loads(hetrun_cli("report", str(run_dir), "--runs-dir", str(runs), "--json").stdout)
    [row] = report["restart_history"]
    assert row["work_lost_iterations"] == lost, (row, ignored)
    assert any("ignored the stop signal (SIGUSR1)" in line for line in row["detail"]), row


def test_each_stop_signal_reaches_the_program_once(tmp_path: Path) -> None:
    counts = tmp_path / "signals.jsonl"
    script = _script(tmp_path, "count.py", COUNTS_SIGNALS)
    run_dir, runs = _submit(tmp_path, "count-signals", [sys.executable, script, str(counts)],
                            {"grace_seconds": 60, "max_preemptions": 0})
    try:
        assert wait_for(lambda: counts.exists() and counts.read_text().count("\n") >= 1, 120, 0.2)
        ids = json.loads(counts.read_text().splitlines()[0])
        # The supervisor signals the wrapper's process group: the program has it already.
        _preempt(run_dir, runs)
        assert wait_for(lambda: counts.read_text().count("\n") >= 2, 30, 0.2)
        # A signal to the wrapper alone is forwarded.
        os.kill(ids["wrapper"], signal.SIGUSR1)
        assert wait_for(lambda: counts.read_text().count("\n") >= 3, 30, 0.2)
        got = [json.loads(line) for line in counts.read_text().splitlines()[1:]]
    finally:
        hetrun_cli("cancel", str(run_dir), "--runs-dir", str(runs), timeout=60)
    assert [g["sig"] for g in got] == ["SIGUSR1", "SIGUSR1"], got
    assert got[0]["from"] != ids["wrapper"] and got[1]["from"] == ids["wrapper"], (got, ids)


def test_work_lost_reads_steps_of_this_attempt_and_the_newest_checkpoint(tmp_path: Path) -> None:
    lines = [  # rank 1: steps 0..9 in an earlier attempt (checkpoint resume_at 8), 8..13 now (resume_at 12)
        *({"ev": "action", "type": "step", "rank": 1, "iteration": i, "time": 10.0 + i} for i in range(10)),
        {"ev": "checkpoint", "rank": 1, "iteration": 8, "time": 18.5},
        *({"ev": "action", "type": "step", "rank": 1, "iteration": i, "time": 100.0 + i} for i in range(8, 14)),
        {"ev": "checkpoint", "rank": 1, "iteration": 12, "time": 104.5},
        {"ev": "checkpoint", "rank": 1, "iteration": 14, "time": 104.6, "ok": False},  # a failed write
        {"ev": "action", "type": "step", "rank": 0, "iteration": 50, "time": 105.0},  # another rank
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    lost = work_lost(tmp_path, 1, since=99.0)
    assert lost == {"work_lost": "2 steps since its last checkpoint (step 11)", "work_lost_steps": 2,
                    "last_step": 13, "last_checkpoint_step": 11}
    assert work_lost(tmp_path, 2, since=0.0)["work_lost"] == \
        "unknown: the program logs no steps through the run API; no checkpoint"

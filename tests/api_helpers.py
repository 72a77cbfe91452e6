"""Running examples/ddp_train_hetrun.py (and its baseline) for the run-API tests:
uninterrupted, or stopped by a real signal once a given step was logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_train_hetrun.py"
BASELINE = ROOT / "examples" / "ddp_train.py"
EXIT_REQUEUE = 85


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def command(script: Path, out: Path, steps: int, nproc: int, step_time: float) -> list[str]:
    args = [str(script), "--steps", str(steps), "--out", str(out), "--step-time", str(step_time)]
    if nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            *args]


def run_once(cmd: list[str], run_dir: Path, *, stop_rank: int | None = None, stop_after: int = 0,
             sig: int = signal.SIGUSR1, timeout: float = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; when ``stop_rank`` is given, send ``sig`` to that rank's pid
    (from its ``start`` event) once it logged a step >= ``stop_after``."""
    env = {**(env or os.environ), "HETRUN_RUN_DIR": str(run_dir)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start = len(events(run_dir))
    deadline = time.monotonic() + timeout
    while stop_rank is not None and proc.poll() is None and time.monotonic() < deadline:
        evs = events(run_dir)[start:]
        pids = [e["pid"] for e in evs if e.get("ev") == "start" and e.get("rank") == stop_rank]
        done = [e for e in evs if e.get("ev") == "action" and e.get("rank") == stop_rank
                and e.get("iteration", -1) >= stop_after]
        if pids and done:
            os.kill(pids[-1], sig)
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def final_params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key

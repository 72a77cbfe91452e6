"""Running the hetrun CLI as a user would (a subprocess), for tests of whole commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def hetrun_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m hetrun.cli ARGS`` with a wide terminal (tables are not cut)."""
    return subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"}, check=False)


def write_job(job_dir: Path, doc: dict[str, Any]) -> Path:
    """``job_dir/job.yaml`` holding ``doc`` (JSON is YAML)."""
    path = job_dir / "job.yaml"
    path.write_text(json.dumps(doc))
    return path


def run_dir_of(proc: subprocess.CompletedProcess[str]) -> Path:
    """The run directory `hetrun submit` printed ("run directory: PATH")."""
    return Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("run directory: ")))


def submit_yaml_and_wait(job_dir: Path, text: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Write ``job_dir/job.yaml``, `hetrun submit --wait` it (runs under job_dir/runs), require
    success; the finished submit and its run directory."""
    (job_dir / "job.yaml").write_text(text)
    proc = hetrun_cli("submit", str(job_dir / "job.yaml"), "--runs-dir", str(job_dir / "runs"), "--wait",
                      timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, run_dir_of(proc)

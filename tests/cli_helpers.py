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

"""The CLI's start-up path stays light: no torch, no mpi4py for --help and status."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from hetrun.cli.app import main
try:
    main({argv!r})
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "mpi4py", "numpy", "triton") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize("argv", [["--help"], ["status"], ["plan", "--help"], ["submit", "--help"]])
def test_light_commands_import_no_heavy_modules(argv: list[str], tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        env={"HETRUN_RUNS": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY=")]
    assert line, proc.stdout + proc.stderr
    assert line[-1] == "HEAVY=", f"{argv} imported heavy modules: {line[-1]}\n{proc.stderr}"

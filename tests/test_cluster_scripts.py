"""The set-up, test, demo and CI scripts: strict bash, lint-clean, and test.sh's exit code contract."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from setup_tools import SHELLCHECK

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / "scripts" / n for n in ("setup.sh", "test.sh", "demo.sh")] + [ROOT / ".ci" / "run"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_is_strict_executable_bash(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert script.stat().st_mode & 0o111, f"{script} is not executable"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@SHELLCHECK
def test_scripts_are_shellcheck_clean() -> None:
    proc = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_setup_pins_torch_before_installing_hetrun() -> None:
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "torch==2.13.0" in text
    assert text.index("pip_install torch==2.13.0") < text.index('pip_install -e ".[dev,gpu,lightning,s3]"')


@pytest.mark.slurm
def test_test_sh_fails_when_no_test_is_collected(slurm_cluster: object) -> None:
    # Runs the real script (setup check, cluster up, pytest) with a selection that matches nothing.
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test.sh"), str(ROOT / "tests" / "test_cluster_conf.py"),
         "-k", "no_test_has_this_name", "-q"],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )
    assert proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "collected no tests" in proc.stderr

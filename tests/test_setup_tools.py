"""tests/setup_tools.py: a missing tool that scripts/setup.sh installs skips a test here and fails it
in CI; and setup.sh's apt list holds every such tool."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from setup_tools import import_or_require, require

SETUP = Path(__file__).resolve().parent.parent / "scripts" / "setup.sh"


def test_a_missing_tool_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    require(True, "anything")  # present: nothing happens
    with pytest.raises(pytest.skip.Exception, match="needs tmux"):
        require(False, "tmux")
    with pytest.raises(pytest.skip.Exception, match="no_such_package_here"):
        import_or_require("no_such_package_here", "no_such_package_here (pip)")


def test_a_missing_tool_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"tmux .*missing: scripts/setup\.sh installs it"):
        require(False, "tmux (apt tmux)")
    with pytest.raises(pytest.fail.Exception, match="in CI this test fails instead of skipping"):
        import_or_require("no_such_package_here", "no_such_package_here (pip)")


def test_setup_installs_every_apt_tool_a_test_requires() -> None:
    listed = re.search(r"^APT_PACKAGES=\((.*)\)$", SETUP.read_text(), re.M)
    assert listed, "scripts/setup.sh has no APT_PACKAGES=(...) line"
    packages = set(listed.group(1).split())
    # mpirun, tmux, the C compiler for hetrun's kernels, libzstd, Slurm's job_submit.lua, chromium.
    assert {"openmpi-bin", "tmux", "gcc", "libc6-dev", "libzstd1", "lua5.1", "chromium"} <= packages, packages

"""On the local backend a failing rank ends the job's other processes at once, as srun's
--kill-on-bad-exit and the batch script's srun reader do: an evaluator waiting for checkpoints (or peers
in a collective) must not keep a failed job alive until their own timeouts, and the
attempt is named by the rank that failed, not by the peers the supervisor then ended."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hetrun.slurm_plugin.rundir import events_of

from tests.cli_helpers import hetrun_cli, write_job

FAILS = "import sys, time; time.sleep(1); sys.stderr.write('trainer: loss is NaN\\n'); sys.exit(3)"
WAITS = "import time; time.sleep(600)"  # an evaluator that would wait for checkpoints that never come


@pytest.mark.slow
def test_a_failing_component_ends_the_waiting_one_and_names_the_failure(tmp_path: Path) -> None:
    comps = {name: {"nodes": 1, "tasks_per_node": 1, "mem": "1G", "command": [sys.executable, "-c", code]}
             for name, code in (("trainer", FAILS), ("evaluator", WAITS))}
    doc = {"name": "first-failure", "components": comps, "checkpoint": {"interval": 1}}
    runs = tmp_path / "runs"
    # The subprocess timeout (300 s) is below the evaluator's 600 s sleep: a hang fails the test.
    proc = hetrun_cli("submit", str(write_job(tmp_path, doc)), "--backend", "local", "--runs-dir", str(runs),
                      "--wait", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")))
    # The evaluator was killed after the trainer's exit 3 (no exit or failure of its own recorded).
    exits = {e["component"]: e for e in events_of(run_dir, ("exit",))}
    assert exits["trainer"]["code"] == 3 and "evaluator" not in exits, exits
    assert {f["component"] for f in events_of(run_dir, ("rank_failure",))} == {"trainer"}
    [end] = events_of(run_dir, ("attempt_end",))
    assert end["outcome"] == "failed", end
    assert "trainer" in end["reason"] and end["reason"].count("loss is NaN") == 1, end
    status = hetrun_cli("status", str(run_dir))
    assert "trainer" in status.stdout and "loss is NaN" in status.stdout, status.stdout

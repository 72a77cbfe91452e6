"""Slurm accounting in `hetrun report`: parsing real `sacct --json -D` output (Slurm 22.05,
captured from the local cluster), across requeues, and a note instead of a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hetrun.reports.sacct import accounting_rows, slurm_accounting

SAMPLE = Path(__file__).parent / "data" / "report" / "sacct_het_5.json"  # het job 5: 2 components


def _doc() -> dict[str, Any]:
    return json.loads(SAMPLE.read_text())


def test_rows_per_component_from_real_sacct_json() -> None:
    rows = accounting_rows(_doc(), "5", ["learner", "rollout"])
    assert [(r["component"], r["job_id"], r["attempt"]) for r in rows] == [("learner", "5", 0), ("rollout", "6", 0)]
    learner, rollout = rows
    assert learner["state"] == "COMPLETED" and learner["elapsed_s"] == 2 and learner["nodes"] == "n1"
    assert learner["alloc_tres"] == "cpu=1,mem=300M,node=1" and learner["exit_code"] == "0:0"
    assert rollout["tres"]["node"] == 2 and rollout["nodes"] == "n[2-3]"
    assert accounting_rows(_doc(), "5", ["x", "y"], name="another-job") == []


def test_a_requeued_job_has_one_row_per_attempt() -> None:
    doc = _doc()
    # sacct -D lists the earlier attempt first (same job ids): make one as Slurm records a preemption
    first = copy.deepcopy(doc["jobs"])
    for job in first:
        job["state"]["current"] = "PREEMPTED"
        job["time"]["elapsed"] = 40
    doc["jobs"] = first + doc["jobs"]
    rows = accounting_rows(doc, "5", ["learner", "rollout"])
    assert [(r["component"], r["attempt"], r["state"]) for r in rows] == [
        ("learner", 0, "PREEMPTED"), ("rollout", 0, "PREEMPTED"),
        ("learner", 1, "COMPLETED"), ("rollout", 1, "COMPLETED")]


def _fake_sacct(rc: int, out: str = "", err: str = "") -> Any:
    """Stands in for the sacct binary's answer (a cluster without accounting cannot be made here)."""
    return lambda cmd: subprocess.CompletedProcess(cmd, rc, out, err)


@pytest.mark.parametrize(("runner", "note"), [
    (_fake_sacct(1, err="sacct: error: Slurm accounting storage is disabled"), "not configured"),
    (_fake_sacct(1, err="sacct: error: Problem talking to the database: Connection refused"),
     "sacct failed: sacct: error: Problem talking to the database"),
    (_fake_sacct(0, out="JobID|State\n"), "not JSON"),
    (_fake_sacct(0, out='{"jobs": []}'), "no record of job 5"),
])
def test_what_goes_wrong_is_one_note(runner: Any, note: str) -> None:
    acc = slurm_accounting("5", "sbatch", ["a"], runner=runner)
    assert acc["rows"] == [] and note in acc["note"]


def test_no_sacct_binary_and_local_runs_are_notes(tmp_path: Path) -> None:
    def missing(cmd: Any) -> Any:
        raise FileNotFoundError("sacct")

    assert "not installed" in slurm_accounting("5", "sbatch", ["a"], runner=missing)["note"]
    assert slurm_accounting("5", "local", ["a"])["note"] == "local run: no Slurm accounting"
    assert "no Slurm job id" in slurm_accounting(None, "sbatch", ["a"])["note"]


@pytest.mark.slurm
def test_the_real_sacct_answers_for_a_job_it_does_not_know() -> None:
    acc = slurm_accounting("987654321", "sbatch", ["a"])
    assert acc["rows"] == [] and acc["note"]  # "no record", or why accounting is unavailable

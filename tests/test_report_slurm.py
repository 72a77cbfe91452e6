"""`hetrun report` over real runs on the local Slurm cluster: one preempted through the
`high` partition and resumed, one that failed. The report's restart section must carry the
real cause, what was restored and the work lost; status and report agree; sacct's rows span
the requeue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.reports.attempts import status_summary
from hetrun.reports.run_report import build_report
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import events_of, wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from test_resume_slurm import _idle_node, _preempt

HERE = Path(__file__).parent
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _spec(name: str, job_dir: Path, workload: str, args: dict[str, Any], iterations: int) -> Any:
    node = _idle_node()
    return spec_from_dict({
        "name": name, "workload": workload, "workload_args": args,
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": iterations, "micro_batches": 1, "pipeline_window": 1,
                     "seed": 3},
        "checkpoint": {"interval": 4, "keep": 5},
        "slurm": {"partition": "debug", "time": "00:10:00", "extra": [f"--nodelist={node}"] if node else []},
        "env": {"OMP_NUM_THREADS": "1", "HETRUN_JOB_DIR": str(job_dir)},
    })


def _cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_report_of_a_preempted_and_resumed_run(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    job_dir = shared_tmp / "job"
    job_dir.mkdir()
    (job_dir / "resume_workload.py").write_text((HERE / "test_resume_workload.py").read_text())
    spec = _spec("report-preempt", job_dir, "resume_workload:ResumeProbe", {"sleep": 0.4}, 16)
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)
    try:
        def past_a_checkpoint() -> bool:
            return any(e.get("iteration", -1) >= 6 for e in events_of(run_dir, ("action",)))

        assert wait_for(past_a_checkpoint, 180, 0.5)
        node = next(e["node"] for e in events_of(run_dir, ("start",)))
        _preempt(node, shared_tmp)
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=400, poll_s=1)
    finally:
        subprocess.run(["scancel", str(res.run.job_id).split(";")[0]], check=False, capture_output=True)
    assert [c.state for c in final.components] == ["COMPLETED"], final
    rep = build_report(run_dir)
    assert rep.counts["restarts"] == 1 and rep.counts["preemptions"] == 1, (rep.counts, events_of(run_dir, ("attempt_end",)))
    (row,) = rep.restart_history
    assert row["cause"] == "preempted"
    learner = row["components"]["learner"]
    assert learner["state"] == "restored" and learner["step"] >= 4, row
    assert row["queue_wait_s"] is not None and row["queue_wait_s"] >= 0
    assert row["first_step_s"] is not None and row["first_step_s"] > 0
    assert row["work_lost_iterations"] is not None and row["work_lost_s"] is not None
    assert rep.outcome["outcome"] == "done" and rep.outcome["attempt"] == 1
    counts, lost = status_summary(run_dir)
    assert rep.counts["restarts"] == counts.restarts and lost == rep.work_lost
    acc = rep.accounting
    if acc["note"] is None:  # accounting is up on the local cluster; the rows span the requeue
        states = [r["state"] for r in acc["rows"] if r["component"] == "learner"]
        assert len(states) >= 2 and states[-1] == "COMPLETED", acc
    text = _cli("report", str(run_dir))
    assert f"learner@{learner['step']}" in text and "preempted" in text and "done (attempt 2)" in text, text
    doc = json.loads(_cli("report", str(run_dir), "--json"))
    assert doc["restart_history"][0]["cause"] == "preempted"


def test_report_of_a_failed_run_names_the_rank(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    job_dir = shared_tmp / "job"
    job_dir.mkdir()
    (job_dir / "runtime_toy.py").write_text((HERE / "runtime_toy.py").read_text())
    spec = _spec("report-fail", job_dir, "runtime_toy:ToyRegression",
                 {"fail_at": 3, "fail_component": "learner"}, 8)
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)
    try:
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=1)
    finally:
        subprocess.run(["scancel", str(res.run.job_id).split(";")[0]], check=False, capture_output=True)
    assert [c.state for c in final.components] == ["FAILED"], final
    rep = build_report(run_dir)
    assert rep.outcome["outcome"] == "failed" and rep.restart_history == []
    assert rep.counts["failures"] == 1, (rep.counts, events_of(run_dir, ("attempt_end", "rank_failure")))
    assert any("rank 0 (learner)" in f for f in rep.outcome["failures"]), rep.outcome
    text = _cli("report", str(run_dir))
    assert "failed: rank 0 (learner)" in text, text

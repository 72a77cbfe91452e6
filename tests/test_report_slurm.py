"""`hetrun report` over a real failed run on the local Slurm cluster: the report names the
failing rank. The report of a run preempted through the `high` partition and resumed is checked
on tests/test_resume_slurm.py's run (preempted twice): one Slurm job for both claims."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.reports.run_report import build_report
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import events_of
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from test_resume_slurm import _cli, _idle_node

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

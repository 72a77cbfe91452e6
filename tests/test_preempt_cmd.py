"""`hetrun preempt RUN`: the documented stop signal reaches a real run, every rank
checkpoints at the agreed step, the run is requeued and resumes from exactly that
checkpoint (no work lost), on the local backend and on the local Slurm cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hetrun.slurm_plugin.rundir import events_of, wait_for
from setup_tools import MPIRUN

from tests.cli_helpers import hetrun_cli, write_job
from tests.preempt_helpers import release_if_held

HERE = Path(__file__).parent


def _job(job_dir: Path, name: str, slurm: dict[str, Any] | None) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "resume_workload.py").write_text((HERE / "test_resume_workload.py").read_text())
    doc = {
        "name": name, "workload": "resume_workload:ResumeProbe", "workload_args": {"sleep": 0.3},
        "components": {"learner": {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": 24, "micro_batches": 1, "pipeline_window": 1, "seed": 3},
        "checkpoint": {"interval": 5, "keep": 5},
        "env": {"OMP_NUM_THREADS": "1"},
        **({"slurm": slurm} if slurm else {}),
    }
    return write_job(job_dir, doc)


def _submit(job: Path, backend: str, runs: Path) -> Path:
    proc = hetrun_cli("submit", str(job), "--backend", backend, "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    return Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("run directory: ")))


def _preempt_after_a_checkpoint(run_dir: Path, runs: Path) -> subprocess.CompletedProcess[str]:
    def past_first_checkpoint() -> bool:
        return any(e.get("reason") == "interval" for e in events_of(run_dir, ("checkpoint",)))

    assert wait_for(past_first_checkpoint, 240, 0.3), "no interval checkpoint"
    proc = hetrun_cli("preempt", str(run_dir), "--runs-dir", str(runs), "--wait", "--wait-timeout", "120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sent SIGUSR1 to" in proc.stdout and "attempt 0 ended: time_limit, requeued: yes" in proc.stdout, \
        proc.stdout
    return proc


def _assert_resumed_from_the_stop_checkpoint(run_dir: Path) -> None:
    [end0] = [e for e in events_of(run_dir, ("attempt_end",)) if e["restart_count"] == 0]
    stops = [e for e in events_of(run_dir, ("checkpoint",)) if e.get("reason") == "preempt"]
    assert len(stops) == 2 and len({e["info"]["step"] for e in stops}) == 1, stops  # both ranks, one step
    step = stops[0]["info"]["step"]
    assert all(e["time"] <= end0["time"] for e in stops)  # one time key on every line (hetrun.rundir)
    restores = [e for e in events_of(run_dir, ("restore",)) if e.get("restart_count") == 1]
    assert len(restores) == 2 and all(e["restored_state"] and e["step"] == step for e in restores), restores
    assert all(e.get("work_lost") == 0 for e in restores), restores


needs_mpirun = MPIRUN


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow
def test_preempt_a_local_run_checkpoints_restarts_and_finishes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir = _submit(_job(tmp_path / "job", "preempt-local", None), "local", runs)
    try:
        _preempt_after_a_checkpoint(run_dir, runs)
        assert wait_for(lambda: len(events_of(run_dir, ("attempt_end",))) == 2, 240, 0.5)
    finally:
        hetrun_cli("cancel", str(run_dir), "--runs-dir", str(runs), timeout=60)
    assert events_of(run_dir, ("attempt_end",))[1]["outcome"] == "done"
    _assert_resumed_from_the_stop_checkpoint(run_dir)


def test_preempt_refuses_a_run_that_is_not_running(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir = runs / "ended"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"components": [], "preemption": {"signal": "USR1"}}))
    (run_dir / "run.json").write_text(json.dumps({"name": "ended", "backend": "local", "job_id": "local-1",
                                                  "components": ["learner"], "pids": {}}))
    (run_dir / "local.json").write_text(json.dumps({"state": "COMPLETED"}))
    proc = hetrun_cli("preempt", "ended", "--runs-dir", str(runs), timeout=60)
    assert proc.returncode != 0 and "cannot preempt ended: it is COMPLETED, not RUNNING" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slurm
@pytest.mark.slow
def test_preempt_a_slurm_run_requeues_it_and_it_resumes(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    runs = shared_tmp / "runs"
    run_dir = _submit(_job(shared_tmp / "job", "preempt-slurm", {"partition": "debug", "time": "00:10:00"}),
                      "sbatch", runs)
    try:
        _preempt_after_a_checkpoint(run_dir, runs)
        job = json.loads((run_dir / "run.json").read_text())["job_id"]
        # Requeued by its own batch script (exit 85): released from Slurm's requeue hold at once.
        assert wait_for(lambda: (release_if_held(str(job)), len(events_of(run_dir, ("attempt_end",))) == 2)[1],
                        300, 1), \
            events_of(run_dir, ("attempt_end",))
    finally:
        hetrun_cli("cancel", str(run_dir), "--runs-dir", str(runs), timeout=60)
    assert events_of(run_dir, ("attempt_end",))[1]["outcome"] == "done"
    _assert_resumed_from_the_stop_checkpoint(run_dir)

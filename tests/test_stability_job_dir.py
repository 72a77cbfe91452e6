"""A workload module kept next to the job YAML is importable on every rank.

``hetrun submit JOB.yaml`` records the YAML's directory as ``job_dir`` in
plan.json; the ranks add it to their import path. The job directory is a
fresh directory outside /tmp (``shared_tmp``) and outside the run directory,
so the only way a rank can find the module is through ``job_dir``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.slurm_plugin.submit import resolve_job_dir, submit_file, submit_spec, wait_for_end

from hetrun.errors import RunDirError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runtime_toy import toy_job_yaml  # noqa: E402

MODULE = "neighbour_workload_mod"


def _job_dir(root: Path) -> Path:
    job_dir = root / "my job"  # a space: the path reaches the ranks quoted
    job_dir.mkdir()
    (job_dir / f"{MODULE}.py").write_text((HERE / "runtime_toy.py").read_text())
    doc = json.loads(toy_job_yaml(iterations=3, learners=1, rollouts=1, eval_interval=0))
    doc["workload"] = f"{MODULE}:ToyRegression"
    doc["name"] = "neighbour"
    (job_dir / "job.yaml").write_text(json.dumps(doc))
    return job_dir


def _finished(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
              if line.strip()]
    return [e for e in events if e.get("ev") == "exit"]


def test_job_dir_is_recorded_absolute(shared_tmp: Path) -> None:
    job_dir = _job_dir(shared_tmp)
    res = submit_file(job_dir / "job.yaml", backend="local", runs_dir=shared_tmp / "runs",
                      dry_run=True)
    assert res.dry_run is not None
    assert resolve_job_dir(Path("tests")) == str(HERE)
    with pytest.raises(RunDirError, match="not a directory"):
        resolve_job_dir(job_dir / "job.yaml")


def test_neighbour_workload_runs_through_the_local_backend(shared_tmp: Path) -> None:
    from hetrun.slurm_plugin.backends.local import LocalBackend

    job_dir = _job_dir(shared_tmp)
    res = submit_file(job_dir / "job.yaml", backend="local", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["job_dir"] == str(job_dir)
    final = wait_for_end(res.run, LocalBackend(), timeout_s=150, poll_s=0.5)
    logs = {p.name: p.read_text()[-2000:] for p in (run_dir / "logs").iterdir()}
    assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], logs
    assert len(_finished(run_dir)) == 2, logs


def test_without_job_dir_the_module_is_not_found(shared_tmp: Path) -> None:
    """The control: the same job submitted without its directory cannot import the module."""
    from hetrun.dag.spec import load_spec
    from hetrun.slurm_plugin.backends.local import LocalBackend

    job_dir = _job_dir(shared_tmp)
    res = submit_spec(load_spec(job_dir / "job.yaml"), backend="local", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)
    assert json.loads((run_dir / "plan.json").read_text())["job_dir"] is None
    final = wait_for_end(res.run, LocalBackend(), timeout_s=150, poll_s=0.5)
    assert "FAILED" in [c.state for c in final.components], final
    logs = "".join(p.read_text() for p in (run_dir / "logs").iterdir())
    assert MODULE in logs, logs[-3000:]


def test_neighbour_workload_runs_on_the_cluster(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend

    job_dir = _job_dir(shared_tmp)
    proc = subprocess.run(
        [sys.executable, "-m", "hetrun.cli", "submit", str(job_dir / "job.yaml"), "--backend", "sbatch",
         "--runs-dir", str(shared_tmp / "runs")],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")))
    from hetrun.slurm_plugin.rundir import read_run

    run = read_run(run_dir)
    try:
        assert json.loads((run_dir / "plan.json").read_text())["job_dir"] == str(job_dir)
        final = wait_for_end(run, SbatchBackend(), timeout_s=240, poll_s=2)
        logs = {p.name: p.read_text()[-2000:] for p in (run_dir / "logs").iterdir()}
        assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], logs
        assert len(_finished(run_dir)) == 2, logs
    finally:
        subprocess.run(["scancel", str(run.job_id)], check=False, capture_output=True)

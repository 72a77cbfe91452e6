"""Mistakes refused before the queue, typed as a user would (issue 24): a partition the
cluster does not have, a command whose script is missing or lies under a node-private /tmp.
Each is refused with the same one-line error at `hetrun plan`, `hetrun submit --dry-run` and
`hetrun submit`, on the shared Slurm cluster (the controller is what lists the partitions),
and a refused submit leaves no run directory behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from cli_helpers import hetrun_cli

JOB = """\
name: prequeue
components:
  trainer:
    nodes: 1
    command: [python3, {script}]
"""

POINTS = {
    "plan": ("plan",),
    "dry-run": ("submit", "--dry-run"),
    "submit": ("submit",),
}


def _job(job_dir: Path, script: str = "train.py") -> Path:
    (job_dir / "train.py").write_text("print('hello')\n")
    path = job_dir / "job.yaml"
    path.write_text(JOB.format(script=script))
    return path


def _run(point: str, job: Path, runs: Path, *extra: str) -> tuple[int, str]:
    cmd, *flags = POINTS[point]
    args = [cmd, str(job), *flags, *extra]
    if cmd == "submit":
        args += ["--runs-dir", str(runs)]
    proc = hetrun_cli(*args, timeout=120)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("point", list(POINTS))
def test_an_unknown_partition_is_refused_with_the_cluster_s_partitions(slurm_cluster, shared_tmp: Path,
                                                                        point: str) -> None:
    job, runs = _job(shared_tmp), shared_tmp / "runs"
    rc, err = _run(point, job, runs, "-p", "gpu")
    assert rc == 2, err
    assert "slurm.partition: partition 'gpu' does not exist on this cluster (sinfo lists debug, high)" in err
    assert "fix: use partitions sinfo lists: -p debug" in err
    assert "Traceback" not in err and "no cluster answered" not in err
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("point", list(POINTS))
def test_a_missing_script_is_refused_before_the_queue(slurm_cluster, shared_tmp: Path, point: str) -> None:
    job, runs = _job(shared_tmp, "trian.py"), shared_tmp / "runs"
    rc, err = _run(point, job, runs)
    assert rc == 2, err
    assert f"job.yaml: components.trainer.command: script 'trian.py' does not exist (looked for " \
           f"{shared_tmp.resolve() / 'trian.py'})" in err
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("point", list(POINTS))
def test_a_missing_program_is_refused_before_the_queue(slurm_cluster, shared_tmp: Path, point: str) -> None:
    job, runs = _job(shared_tmp), shared_tmp / "runs"
    job.write_text(job.read_text().replace("[python3, ", "[pythn3-hetrun-missing, "))
    rc, err = _run(point, job, runs)
    assert rc == 2, err
    assert "job.yaml: components.trainer.command: program 'pythn3-hetrun-missing' is not on PATH" in err, err
    assert "fix: give its full path" in err and "Traceback" not in err
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("point", list(POINTS))
def test_a_script_under_tmp_is_refused_when_bound_for_slurm(slurm_cluster, shared_tmp: Path, point: str) -> None:
    with tempfile.TemporaryDirectory(prefix="hetrun-prequeue-", dir="/tmp") as private:
        job = _job(Path(private))
        rc, err = _run(point, job, shared_tmp / "runs")
    assert rc == 2, err
    assert "components.trainer.command: script 'train.py' is /tmp/" in err
    assert "which is private to each Slurm node" in err and "--backend local" in err
    assert not (shared_tmp / "runs").exists() or not any((shared_tmp / "runs").iterdir())


def test_a_submit_sbatch_refuses_leaves_no_run_directory(slurm_cluster, shared_tmp: Path) -> None:
    # A mistake only the controller can see (a node feature no node has): sbatch refuses it.
    job, runs = _job(shared_tmp), shared_tmp / "runs"
    rc, err = _run("submit", job, runs, "--constraint", "nosuchfeature")
    assert rc != 0 and "Invalid feature specification" in err, err
    assert "nothing was queued" in err
    assert list(runs.iterdir()) == []
    status = hetrun_cli("status", "--runs-dir", str(runs), timeout=60)
    assert "NOT_SUBMITTED" not in status.stdout

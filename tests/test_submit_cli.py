"""`hetrun submit/status/cancel` at the command line: dry runs, errors and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "ppo_cartpole.yaml"


def hetrun(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "HETRUN_RUNS"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=120, check=False)


def test_dry_run_prints_the_script_and_writes_nothing(shared_tmp: Path) -> None:
    # A shared directory: the sbatch backend refuses runs under /tmp (private to each node).
    proc = hetrun("submit", str(EXAMPLE), "--dry-run", "--backend", "sbatch", "-p", "high", "-t", "00:10:00",
                  cwd=shared_tmp)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --partition=high" in proc.stdout and "#SBATCH --time=00:10:00" in proc.stdout
    assert "would run: sbatch --parsable " in proc.stderr
    assert f"{shared_tmp}/runs/ppo-cartpole-" in proc.stderr  # ./runs by default
    assert list(shared_tmp.iterdir()) == []


def test_node_private_directories_are_refused_for_slurm_before_the_queue(tmp_path: Path, shared_tmp: Path) -> None:
    bad = hetrun("submit", str(EXAMPLE), "--dry-run", "--backend", "sbatch", cwd=tmp_path)
    assert bad.returncode == 4 and "private to each Slurm node" in bad.stderr and "/tmp" in bad.stderr
    bad = hetrun("submit", str(EXAMPLE), "--dry-run", "--backend", "sbatch", "--runs-dir", str(shared_tmp),
                 "--set", "checkpoint.directory=/dev/shm/ck", cwd=tmp_path)
    assert bad.returncode == 4 and "checkpoint.directory is /dev/shm/ck" in bad.stderr
    # A workload module next to a YAML under /tmp would not import on the nodes.
    (tmp_path / "mine.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text(EXAMPLE.read_text().replace("hetrun.examples.ppo:PPOWorkload", "mine:Work"))
    bad = hetrun("submit", str(job), "--dry-run", "--backend", "sbatch", "--runs-dir", str(shared_tmp),
                 cwd=tmp_path)
    assert bad.returncode == 4 and "workload module of mine:Work" in bad.stderr, bad.stderr
    ok = hetrun("submit", str(job), "--dry-run", "--backend", "local", "--runs-dir", str(tmp_path), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


def test_local_dry_run_shows_the_mpirun_launch(tmp_path: Path) -> None:
    proc = hetrun("submit", str(EXAMPLE), "--dry-run", "--backend", "local", "--runs-dir", str(tmp_path / "r"),
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "HETRUN_COMPONENT=learner" in proc.stderr and "HETRUN_COMPONENT=rollout" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_user_errors_are_one_line_with_the_right_exit_code(tmp_path: Path) -> None:
    bad = hetrun("submit", str(EXAMPLE), "--dry-run", "-p", "debug;touch x", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "partition" in bad.stderr
    assert not (tmp_path / "x").exists()
    bad = hetrun("submit", str(EXAMPLE), "--dry-run", "--backend", "slurmm", cwd=tmp_path)
    assert bad.returncode == 3 and "unknown backend" in bad.stderr and "Traceback" not in bad.stderr
    bad = hetrun("submit", str(EXAMPLE), "--dry-run", "--runs-dir", str(tmp_path / "a b"), cwd=tmp_path)
    assert bad.returncode == 4 and "#SBATCH" in bad.stderr and "Traceback" not in bad.stderr
    bad = hetrun("cancel", "nope", cwd=tmp_path)
    assert bad.returncode == 4 and "no run matches" in bad.stderr
    bad = hetrun("status", "nope", cwd=tmp_path)
    assert bad.returncode == 4 and "Traceback" not in bad.stderr


def test_status_without_runs(tmp_path: Path) -> None:
    proc = hetrun("status", cwd=tmp_path, HETRUN_RUNS=str(tmp_path / "none"))
    assert proc.returncode == 0 and "no runs under" in proc.stdout


def test_status_shows_other_backends_when_slurm_is_unreachable(tmp_path: Path) -> None:
    from hetrun.slurm_plugin.rundir import RunInfo, create_run_dir, write_run

    runs = tmp_path / "runs"
    for backend, job in (("sbatch", "123"), ("local", "local-1")):
        d = create_run_dir(runs, f"x{backend}")
        write_run(RunInfo(name=f"x{backend}", run_dir=str(d), backend=backend, job_id=job,
                          components=["learner"], pids={"supervisor": 2**22 + 7, "start_ticks": 1}))
    # A PATH with Python but no Slurm tools.
    proc = hetrun("status", "--runs-dir", str(runs), cwd=tmp_path, PATH=str(Path(sys.executable).parent))
    assert proc.returncode == 3, proc.stderr
    assert "not on PATH" in proc.stderr and "Traceback" not in proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("x")}
    assert len(rows) == 2
    assert "ERROR" in next(v for k, v in rows.items() if k.startswith("xsbatch"))
    assert "localhost" in next(v for k, v in rows.items() if k.startswith("xlocal"))


def test_bad_workload_args_and_codecs_stop_submit_before_the_queue(shared_tmp: Path) -> None:
    """Issue 12: `num_envs: "eight"` used to pass `submit --dry-run` and fail on the ranks."""
    job = shared_tmp / "job.yaml"
    job.write_text(EXAMPLE.read_text().replace("num_envs: 8", 'num_envs: "eight"'))
    bad = hetrun("submit", str(job), "--dry-run", "--backend", "local", cwd=shared_tmp)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert f"{job}:" in bad.stderr and "workload_args.num_envs: expected an integer" in bad.stderr
    bad = hetrun("submit", str(EXAMPLE), "--dry-run", "--backend", "local", "--set", "comms.forward_codec=int9",
                 cwd=shared_tmp)
    assert bad.returncode == 2 and "override --set comms.forward_codec=int9" in bad.stderr
    assert "unknown codec 'int9'" in bad.stderr
    assert [p.name for p in shared_tmp.iterdir()] == ["job.yaml"]

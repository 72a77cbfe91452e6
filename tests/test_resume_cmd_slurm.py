"""`hetrun resume RUN` on the real local Slurm cluster: the CartPole PPO example is
scancel'ed (`hetrun cancel`) after its first checkpoint, resumed as a new Slurm job
in the same run directory, and ends with the checkpoint an uninterrupted Slurm run
of the same spec writes.

The example's learner pauses 0.1 s after each update (tests/resume_slow_workloads.py,
copied beside the job file): unpaused, the 64 iterations after the first checkpoint took
about 3 s on an idle fast VM, and once the run reached its end before the cancel (the
`hetrun cancel` CLI and Slurm's signal) landed."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hetrun.slurm_plugin.rundir import events_of, find_run
from hetrun.slurm_plugin.submit import backend_for, is_finished

from tests.resume_compare import assert_same_checkpoints
from tests.test_resume_cmd import ITERATIONS, SMALL_PPO, cli, store_steps
from tests.test_resume_cmd import job_file as ppo_job_file

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
HERE = Path(__file__).parent
PAUSE_S = 0.1


def job_file(tmp: Path) -> Path:
    """test_resume_cmd's CartPole job, its learner paused ``PAUSE_S`` after each update."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "resume_slow_workloads.py", tmp / "resume_slow_workloads.py")  # beside job.yaml
    return ppo_job_file(tmp, workload="resume_slow_workloads:SlowPPO",
                        workload_args={**SMALL_PPO["workload_args"], "pause": PAUSE_S})


def submit(job: Path, runs: Path, *extra: str) -> Path:
    res = cli("submit", str(job), "--backend", "sbatch", "--runs-dir", str(runs), *extra)
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(res.stdout.split("run directory:")[1].splitlines()[0].strip())


def wait_ended(run_dir: Path, timeout: float = 400) -> list[str]:
    run = find_run(str(run_dir), run_dir.parent)
    t_end = time.time() + timeout
    while time.time() < t_end:
        status = backend_for(run).status([run])[run.run_dir]
        if is_finished(status):
            return [c.state for c in status.components]
        time.sleep(1)
    raise AssertionError(f"{run_dir} did not end in {timeout}s")


def cancelled_at_a_checkpoint(job: Path, runs: Path) -> Path:
    """Submit ``job``, cancel it once learner and rollout hold a common checkpoint step, wait for its end."""
    run_dir = submit(job, runs)
    t_end = time.time() + 400
    while not (set(store_steps(run_dir, "learner")) & set(store_steps(run_dir, "rollout"))):
        assert time.time() < t_end, "no checkpoint in time"
        time.sleep(0.3)
    assert cli("cancel", str(run_dir)).returncode == 0
    wait_ended(run_dir)
    return run_dir


def test_cancelled_slurm_run_resumed_ends_as_an_uninterrupted_one(slurm_cluster: object, shared_tmp: Path) -> None:
    # The uninterrupted run is a Slurm job of its own beside the one cancelled and resumed, not before it.
    whole = submit(job_file(shared_tmp), shared_tmp / "a")
    try:
        run_dir = cancelled_at_a_checkpoint(job_file(shared_tmp), shared_tmp / "b")
        assert max(store_steps(run_dir, "learner")) < ITERATIONS  # cancelled before the end
        res = cli("resume", str(run_dir), "--wait", timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        ends = events_of(run_dir, ("attempt_end",))
        assert [e["restart_count"] for e in ends] == [0, 1] and ends[-1]["outcome"] == "done", ends
        starts = {e.get("restart_count") for e in events_of(run_dir, ("start",))}
        assert starts == {0, 1}  # SLURM_RESTART_COUNT + HETRUN_RESTART_BASE reached the ranks
        restores = [e for e in events_of(run_dir, ("restore",)) if e.get("restart_count") == 1]
        assert len(restores) == 3 and all(e["restored_state"] for e in restores)
        assert wait_ended(whole) == ["COMPLETED", "COMPLETED"]
        assert_same_checkpoints(whole, run_dir, {"learner": 1, "rollout": 2}, ITERATIONS)
    finally:  # the uninterrupted job never outlives a failed test
        subprocess.run(["scancel", str(find_run(str(whole), whole.parent).job_id)], check=False, capture_output=True)

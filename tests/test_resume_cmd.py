"""`hetrun resume RUN` / `hetrun resubmit RUN --resize`, on the local backend.

Fast checks build a run directory by hand (nothing runs); the mpi/slow ones run
the CartPole PPO example for real (Open MPI ranks, real gymnasium): a cancelled
run resumed ends with the same checkpoint as an uninterrupted one; resized to
3 rollout ranks it finishes, and two resizes from the same checkpoint end
identically. The cancelled run is made once (module fixture); each test
resumes its own copy of it. A shrink (rollout 2 -> 1 ranks, restored and
trained on to a checkpoint) is tests/test_resize_auto.py's real run, whose
``--resize auto`` moves the rollout from 2 ranks to 1 (it was run here too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hetrun.slurm_plugin.backends.local import LocalBackend
from hetrun.slurm_plugin.rundir import (
    RunInfo,
    append_event,
    events_of,
    find_run,
    read_run,
    write_run,
)
from setup_tools import MPIRUN

from tests.resume_compare import assert_same_checkpoints, example_spec

# Some seconds of PPO: the cancel (after the first checkpoint, step 8) lands mid-run; it landed
# at step 27 with the machine at load 9, and cancelled_run asserts it is before the end.
ITERATIONS = 72
INTERVAL = 8  # checkpoint interval
SMALL_PPO = {"training": {"iterations": ITERATIONS, "pipeline_window": 1},
             "workload_args": {"num_envs": 4, "num_steps": 32, "update_epochs": 1, "num_minibatches": 2,
                               "eval_episodes": 1},
             "checkpoint": {"interval": INTERVAL, "keep": 20}}


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def job_file(tmp: Path, **extra: Any) -> Path:
    """SMALL_PPO's CartPole job; a key of ``extra`` replaces SMALL_PPO's whole entry."""
    spec = example_spec("ppo_cartpole", **{**SMALL_PPO, **extra})
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def hand_made_run(tmp: Path) -> Path:
    """A run directory as submit writes it, for a run that ran one attempt and was cancelled."""
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec
    from hetrun.slurm_plugin.render import render_sbatch

    spec = load_spec(job_file(tmp))
    run_dir = tmp / "runs" / "ppo-cartpole-20260101-000000-abcd"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text(spec.to_yaml())
    plan = build_plan(spec)
    (run_dir / "plan.json").write_text(plan.to_json())
    (run_dir / "hetjob.sbatch").write_text(render_sbatch(plan, spec, run_dir))
    (run_dir / "local.json").write_text(json.dumps({"state": "CANCELLED"}))
    write_run(RunInfo(name="ppo-cartpole", run_dir=str(run_dir), backend="local", job_id="local-1",
                      components=["learner", "rollout"]))
    append_event(run_dir, "start", rank=0, restart_count=0)
    append_event(run_dir, "attempt_end", restart_count=0, outcome="cancelled")
    return run_dir


def test_dry_run_counts_attempts_on_and_changes_nothing(tmp_path: Path) -> None:
    run_dir = hand_made_run(tmp_path)
    before = (run_dir / "job.yaml").read_text()
    res = cli("resume", str(run_dir), "--dry-run", "--set", "training.iterations=20", "-t", "00:10:00")
    assert res.returncode == 0, res.stderr
    assert "export SLURM_RESTART_COUNT=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))" in res.stdout
    assert "export HETRUN_RESTART_BASE=1" in res.stdout and "--time=00:10:00" in res.stdout
    assert "as attempt 1" in res.stderr and "nothing was changed" in res.stderr
    assert (run_dir / "job.yaml").read_text() == before


def test_resize_dry_run_names_the_new_sizes(tmp_path: Path) -> None:
    run_dir = hand_made_run(tmp_path)
    res = cli("resubmit", str(run_dir), "--resize", "rollout=3", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "rollout: 2 -> 3 ranks" in res.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["resume", "--set", "workload_args.num_envs=8"], "cannot change workload_args"),
    (["resume", "--set", "training.seed=9"], "cannot change training.seed"),
    (["resume", "--set", "components.rollout.nodes=3"], "use `hetrun resubmit RUN --resize"),
    (["resubmit", "--resize", "actor=2"], "does not have"),
    (["resubmit", "--resize", "rollout"], "is not COMPONENT=RANKS"),
])
def test_overrides_the_checkpoint_cannot_survive_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    run_dir = hand_made_run(tmp_path)
    res = cli(args[0], str(run_dir), *args[1:])
    assert res.returncode != 0 and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_run_without_attempt_end_gets_one_from_the_backend_state(tmp_path: Path) -> None:
    from hetrun.slurm_plugin import resume_run

    run_dir = hand_made_run(tmp_path)
    append_event(run_dir, "start", rank=0, restart_count=1)  # attempt 1 died without its post-mortem
    info = find_run(str(run_dir), tmp_path / "runs")
    rec = resume_run._close_open_attempt(info, resume_run.last_restart(run_dir))
    assert rec is not None and rec["restart_count"] == 1 and rec["outcome"] == "cancelled"
    assert resume_run._close_open_attempt(info, 1) is None  # never twice
    assert resume_run.prepare(info).restart == 2


# ---------------------------------------------------------------- real runs (Open MPI, local backend)

needs_mpirun = MPIRUN


def submit(job: Path, runs: Path, *extra: str) -> Path:
    res = cli("submit", str(job), "--backend", "local", "--runs-dir", str(runs), *extra)
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(res.stdout.split("run directory:")[1].splitlines()[0].strip())


def store_steps(run_dir: Path, component: str) -> list[int]:
    from hetrun.runtime.ckpt import open_store

    path = run_dir / "ckpt" / component
    return open_store(path).steps() if path.is_dir() else []


def wait_ended(run_dir: Path, timeout: float = 300) -> str:
    t_end = time.time() + timeout
    while time.time() < t_end:
        state = json.loads((run_dir / "local.json").read_text()).get("state") \
            if (run_dir / "local.json").exists() else None
        if state in ("COMPLETED", "FAILED", "CANCELLED"):
            return str(state)
        time.sleep(0.5)
    raise AssertionError(f"{run_dir} did not end in {timeout}s")


def cancelled_run(tmp: Path, job: Path | None = None) -> Path:
    """A PPO run (``job``, default SMALL_PPO's) cancelled once the first checkpoint every
    component holds is written, before its last iteration."""
    job = job or job_file(tmp)
    iterations = int(yaml.safe_load(job.read_text())["training"]["iterations"])
    for attempt in range(3):
        run_dir = submit(job, tmp / f"runs-{attempt}")
        t_end = time.time() + 300
        while not (set(store_steps(run_dir, "learner")) & set(store_steps(run_dir, "rollout"))):
            state = json.loads((run_dir / "local.json").read_text()).get("state") \
                if (run_dir / "local.json").exists() else None
            assert time.time() < t_end and state in ("RUNNING", "REQUEUED", None), \
                (run_dir / "logs" / "local-supervisor.out").read_text()[-3000:]
            time.sleep(0.05)
        # What `hetrun cancel` does for a local run (its SIGTERM to the supervisor; the command
        # itself: tests/test_backend_local.py), without the command's start-up: with the 2 cores
        # busy that start-up outlasted the run's last ~60 iterations in 3 runs of 3 (session 41).
        LocalBackend().cancel(read_run(run_dir))
        assert wait_ended(run_dir) == "CANCELLED"
        if max(store_steps(run_dir, "learner")) < iterations:  # cancelled before the end
            return run_dir
        # The run (about 10 s) reached its last checkpoint before the cancel landed: seen when
        # the test's own process was starved by other work on the 2 cores. Another run.
    raise AssertionError(f"3 runs of {job} each finished before the cancel reached it")


@pytest.fixture(scope="module")
def cancelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SMALL_PPO run cancelled mid-run, shared: a test resumes a copy (``copy_of``), never this one."""
    return cancelled_run(tmp_path_factory.mktemp("cancelled"))


def copy_of(run_dir: Path, root: Path) -> Path:
    """``run_dir`` copied to ``root/runs/<its name>`` (a run directory may move: read_run resolves it)."""
    dest = root / "runs" / run_dir.name
    shutil.copytree(run_dir, dest)
    return dest


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpirun
@pytest.mark.xdist_group("resume_cmd_cancelled_run")  # with the other reader of `cancelled`: one worker
def test_cancelled_run_resumed_ends_as_an_uninterrupted_one(tmp_path: Path, cancelled: Path) -> None:
    whole = submit(job_file(tmp_path / "a"), tmp_path / "a" / "runs", "--wait")
    run_dir = copy_of(cancelled, tmp_path / "b")
    res = cli("resume", str(run_dir), "--wait")
    assert res.returncode == 0, res.stdout + res.stderr + (run_dir / "logs" / "local-supervisor.out").read_text()
    assert "as attempt 1" in res.stdout
    ends = events_of(run_dir, ("attempt_end",))
    assert [(e["restart_count"], e["outcome"]) for e in ends] == [(0, "cancelled"), (1, "done")]
    restores = [e for e in events_of(run_dir, ("restore",)) if e.get("restart_count") == 1]
    assert len(restores) == 3 and all(e["restored_state"] and e["work_lost"] is not None for e in restores)
    assert_same_checkpoints(whole, run_dir, {"learner": 1, "rollout": 2}, ITERATIONS)
    from hetrun.reports.attempts import status_summary

    counts, lost = status_summary(run_dir)
    assert counts.restarts == 1 and lost is not None


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpirun
@pytest.mark.xdist_group("resume_cmd_cancelled_run")
def test_resize_rollout_ranks_grow_deterministically(tmp_path: Path, cancelled: Path) -> None:
    """Two grows from one checkpoint end identically. The shrink to 1 rollout rank is
    tests/test_resize_auto.py's (its run's ``auto`` resize takes the rollout from 2 ranks to 1)."""
    copies = {name: copy_of(cancelled, tmp_path / name) for name in ("grow-a", "grow-b")}
    # The resized runs go on two checkpoint intervals past the checkpoint they restore, not to
    # ITERATIONS: enough to train with the new rank count, checkpoint it, and compare.
    restored = max(set(store_steps(cancelled, "learner")) & set(store_steps(cancelled, "rollout")))
    end = min(ITERATIONS, (restored // INTERVAL + 2) * INTERVAL)
    for name, ranks in (("grow-a", 3), ("grow-b", 3)):
        res = cli("resubmit", str(copies[name]), "--resize", f"rollout={ranks}", "--set",
                  f"training.iterations={end}", "--wait")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"rollout: 2 -> {ranks} ranks" in res.stdout
        restores = [e for e in events_of(copies[name], ("restore",)) if e.get("restart_count") == 1]
        assert len(restores) == 1 + ranks and all(e["restored_state"] for e in restores)
        assert {e["step"] for e in restores} == {restored}
        assert {e["resize"]["ranks"] for e in restores if e["component"] == "rollout"} == {ranks}
        assert end in store_steps(copies[name], "learner")  # trained on to the end with the new size
    assert_same_checkpoints(copies["grow-a"], copies["grow-b"], {"learner": 1, "rollout": 3}, end)



def test_a_run_still_running_is_refused(tmp_path: Path) -> None:
    import os

    from hetrun.slurm_plugin import resume_run
    from hetrun.slurm_plugin.backends.local import proc_start_ticks
    from hetrun.slurm_plugin.rundir import read_run

    from hetrun.errors import RunDirError

    run_dir = hand_made_run(tmp_path)
    (run_dir / "local.json").write_text(json.dumps({"state": "RUNNING"}))
    info = read_run(run_dir)
    info.pids = {"supervisor": os.getpid(), "start_ticks": proc_start_ticks(os.getpid())}  # this test: alive
    write_run(info)
    with pytest.raises(RunDirError, match="still RUNNING"):
        resume_run.submit(resume_run.prepare(read_run(run_dir)))
    assert not events_of(run_dir, ("resume",))

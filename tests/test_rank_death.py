"""A dead rank is named and ends the job at once; a failure is requeued only on request.

The launchers' reports parsed here are what srun (Slurm 22.05, het step) and Open MPI 4.1's mpirun printed on this machine.
The end-to-end tests kill -9 a real rank of a real PPO run (local backend and
the local Slurm cluster) at a random moment after its first checkpoint, and
make a rank exit during start-up, before MPI_Init. Each job sets
HETRUN_COLLECTIVE_TIMEOUT far above the test's wait: a job that only ended
through that timeout (the old behaviour) fails the test.

Which rank dies where (issue 23: the kill -9 runs were once run for both ranks
under both launchers): under srun the learner (het group 0) by kill -9 and a
rollout rank (world rank 1, het group 1: srun's task -> global rank mapping) in
the failure-requeue run; under mpirun, which numbers the ranks itself and ends
the job whichever rank dies, a rollout rank (2 by kill -9, 1 in the requeue run).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.budgets import AttemptCounts, Budgets, count_attempts, should_requeue
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.backends.local import LocalBackend
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.postmortem import KILL_MARK, finish_attempt, parse_mpirun, parse_srun
from hetrun.slurm_plugin.rundir import append_event, events_of, wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from preempt_helpers import release_if_held
from setup_tools import MPIRUN

from hetrun.rundir import TIME_KEY

SRUN_KILLED = """\
srun: error: n3: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=5.0
srun: launch/slurm: _step_signal: Terminating StepId=6.0
slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-12-01T15:18:45 ***
srun: error: n1: task 0: Terminated
srun: Force Terminated StepId=5.0
srun: error: n2: task 0: Terminated
"""
SRUN_EXITED = """\
srun: error: n3: task 1: Exited with exit code 3
srun: launch/slurm: _step_signal: Terminating StepId=8.0
srun: error: n2: task 0: Terminated
"""
MPIRUN_KILLED = """\
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).
"""
MPIRUN_EXITED = """\
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[23712,1],2]
  Exit code:    3
"""
# Far above every wait below: the job must end through the launcher, not this timeout.
NO_TIMEOUT_ENV = {"OMP_NUM_THREADS": "1", "HETRUN_COLLECTIVE_TIMEOUT": "900"}


def test_srun_report_names_the_first_task_not_the_ones_srun_ended() -> None:
    [d] = parse_srun(SRUN_KILLED)
    assert (d.node, d.task, d.signal, d.exit_code) == ("n3", 1, "SIGKILL", None)
    [d] = parse_srun(SRUN_EXITED)
    assert (d.node, d.task, d.signal, d.exit_code) == ("n3", 1, None, 3)
    assert [d.task for d in parse_srun("srun: error: n2: tasks 0-2,5: Segmentation fault\n")] == [0, 1, 2, 5]
    assert parse_srun("srun: error: n2: task 0: Segmentation fault\n")[0].signal == "SIGSEGV"


def test_srun_report_stops_at_the_readers_kill_mark() -> None:
    """The peers the batch script's reader SIGKILLed after the first death are not deaths to name."""
    log = ("srun: error: n3: task 1: Killed\n" + KILL_MARK + "\n"
           "srun: error: n1: task 0: Killed\nsrun: error: n2: task 0: Killed\n")
    assert [(d.node, d.task) for d in parse_srun(log)] == [("n3", 1)]


def test_mpirun_report_names_rank_signal_and_exit_code() -> None:
    [d] = parse_mpirun(MPIRUN_KILLED)
    assert (d.rank, d.node, d.signal) == (2, "vm", "SIGKILL")
    [d] = parse_mpirun(MPIRUN_EXITED)
    assert (d.rank, d.exit_code, d.signal) == (2, 3, None)


def _end(restart: int, outcome: str, requeued: bool = True) -> dict[str, Any]:
    return {"ev": "attempt_end", "restart_count": restart, "outcome": outcome, "requeued": requeued}


def test_preemptions_are_unlimited_by_default_and_failures_end_the_run() -> None:
    default = Budgets.from_preemption({})
    many = count_attempts([_end(i, "preempted" if i % 2 else "time_limit") for i in range(10)], 10)
    assert many.preemption_like == 10 and should_requeue("preempted", many, default)[0]
    assert should_requeue("time_limit", many, default)[0]
    assert not should_requeue("failed", count_attempts([_end(0, "failed", False)], 0), default)[0]
    assert not should_requeue("done", AttemptCounts(), default)[0]


def test_failure_budget_is_separate_and_old_max_restarts_limits_preemptions() -> None:
    opt_in = Budgets.from_preemption({"max_failures": 1})
    history = [_end(0, "preempted"), _end(1, "preempted"), _end(2, "failed")]
    assert should_requeue("failed", count_attempts(history, 2), opt_in)[0]
    history.append(_end(3, "failed"))
    ok, why = should_requeue("failed", count_attempts(history, 3), opt_in)
    assert not ok and "max_failures (1) reached" in why
    old = Budgets.from_preemption({"max_restarts": 2})
    assert (old.max_preemptions, old.max_failures, old.preemption_key) == (2, 0, "max_restarts")
    # A restart with no attempt_end (node failure, manual requeue) counts as a preemption.
    counts = count_attempts([_end(0, "preempted"), _end(2, "time_limit")], 2)
    assert counts.unknown == 1 and counts.preemption_like == 3
    ok, why = should_requeue("time_limit", counts, old)
    assert not ok and "preemption.max_restarts (2) reached" in why


def _fake_attempt(run_dir: Path, exits: dict[int, int] | None = None) -> None:
    """plan.json of learner (1 rank) + rollout (2 ranks) and the start (and exit) lines of attempt 0."""
    run_dir.joinpath("plan.json").write_text(json.dumps({"components": [
        {"name": "learner", "ntasks": 1, "nodes": 1, "tasks_per_node": 1},
        {"name": "rollout", "ntasks": 2, "nodes": 2, "tasks_per_node": 1}], "preemption": {}}))
    where = {0: ("learner", "n1", 0), 1: ("rollout", "n2", 0), 2: ("rollout", "n3", 1)}
    for rank, (comp, node, comp_rank) in where.items():
        append_event(run_dir, "start", rank=rank, component=comp, node=node, comp_rank=comp_rank, restart_count=0)
        if exits and rank in exits:
            append_event(run_dir, "exit", rank=rank, component=comp, node=node, code=exits[rank], restart_count=0)


def test_post_mortem_names_srun_task_as_global_rank_and_writes_one_attempt_end(tmp_path: Path) -> None:
    _fake_attempt(tmp_path)
    requeue, end = finish_attempt(tmp_path, restart=0, exit_code=137, launcher="srun", log_text=SRUN_KILLED)
    assert not requeue and end["outcome"] == "failed" and end["failed_ranks"] == [2]
    [f] = events_of(tmp_path, ("rank_failure",))
    assert (f["rank"], f["component"], f["node"], f["signal"], f["detected_by"]) == (2, "rollout", "n3", "SIGKILL", "srun")
    assert "rank 2 (rollout) on n3 died: signal SIGKILL" in end["reason"]
    assert len(events_of(tmp_path, ("attempt_end",))) == 1


def test_post_mortem_trusts_the_ranks_exit_lines_over_the_launchers_code(tmp_path: Path) -> None:
    # Every rank checkpointed and exited 85; srun's code says a straggler was ended (143).
    _fake_attempt(tmp_path, exits={0: 85, 1: 85, 2: 85})
    requeue, end = finish_attempt(tmp_path, restart=0, exit_code=143, launcher="srun", log_text="", trapped="USR1")
    assert requeue and end["outcome"] == "time_limit" and end["signal"] == "USR1"
    assert not events_of(tmp_path, ("rank_failure",))


# -- end to end ---------------------------------------------------------------

def _ppo_spec(name: str, *, iterations: int, preemption: dict[str, Any] | None = None,
              env: dict[str, str] | None = None, **sections: Any) -> Any:
    return spec_from_dict({
        "name": name, "workload": "hetrun.examples.ppo:PPOWorkload",
        "workload_args": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 32},
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 1, "mem": "1G",
                        "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]},
            "rollout": {"nodes": 2, "tasks_per_node": 1, "mem": "700M", "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": iterations, "micro_batches": 1, "seed": 0},
        "checkpoint": {"interval": 2, "keep": 3},
        "preemption": preemption or {},
        "env": {**NO_TIMEOUT_ENV, **(env or {})},
        **sections,
    })


def _events(run_dir: Path, ev: str) -> list[dict[str, Any]]:
    return events_of(run_dir, (ev,))


def _kill_after_first_checkpoint(run_dir: Path, rank: int, restart: int = 0) -> dict[str, Any]:
    """kill -9 of ``rank`` at a random moment after its attempt's first checkpoint that every
    rank has written (a kill after the rollouts' but before the learner's left no step to
    restore: seen here under load)."""
    def ready() -> bool:
        starts = [e for e in _events(run_dir, "start") if e.get("restart_count", 0) == restart]
        if len(starts) != 3:
            return False
        since = min(float(e.get(TIME_KEY, 0)) for e in starts)  # this attempt's checkpoints only
        steps: dict[Any, set[Any]] = {}
        for e in _events(run_dir, "checkpoint"):
            if float(e.get(TIME_KEY, 0)) >= since:
                steps.setdefault(e.get("step"), set()).add(e.get("rank"))
        return any(len(ranks) == 3 for ranks in steps.values())
    assert wait_for(ready, 240, 0.3), f"no checkpoint in attempt {restart}"
    time.sleep(random.uniform(0.0, 1.5))
    start = next(e for e in _events(run_dir, "start") if e["rank"] == rank and e.get("restart_count", 0) == restart)
    os.kill(int(start["pid"]), signal.SIGKILL)
    return start


def _verify_ckpt(run_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "ckpt", "verify", str(run_dir)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _assert_named(run_dir: Path, victim: dict[str, Any], detected_by: str) -> dict[str, Any]:
    fails = [e for e in _events(run_dir, "rank_failure") if e.get("restart_count") == victim.get("restart_count", 0)]
    assert len(fails) == 1, fails
    f = fails[0]
    assert (f["rank"], f["component"], f["node"], f["signal"], f["detected_by"]) == (
        victim["rank"], victim["component"], victim["node"], "SIGKILL", detected_by), f
    return f


needs_mpirun = MPIRUN


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("rank", [2], ids=["rollout"])
def test_local_kill_9_ends_the_run_naming_the_rank(tmp_path: Path, rank: int) -> None:
    res = submit_spec(_ppo_spec(f"kill-local-{rank}", iterations=400), backend="local", runs_dir=tmp_path)
    run_dir = Path(res.run.run_dir)
    try:
        victim = _kill_after_first_checkpoint(run_dir, rank)
        final = wait_for_end(res.run, LocalBackend(), timeout_s=90, poll_s=0.3)
    finally:
        subprocess.run([sys.executable, "-m", "hetrun.cli", "cancel", str(run_dir)], capture_output=True, check=False)
    assert {c.state for c in final.components} == {"FAILED"}, final
    f = _assert_named(run_dir, victim, "mpirun")
    assert f["node"] == socket.gethostname()
    [end] = _events(run_dir, "attempt_end")
    assert (end["outcome"], end["requeued"], end["failed_ranks"]) == ("failed", False, [rank]), end
    _verify_ckpt(run_dir)


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow
def test_local_failure_is_requeued_on_request_and_resumes(tmp_path: Path) -> None:
    spec = _ppo_spec("kill-local-requeue", iterations=200, preemption={"max_failures": 1})
    res = submit_spec(spec, backend="local", runs_dir=tmp_path)
    run_dir = Path(res.run.run_dir)
    try:
        victim = _kill_after_first_checkpoint(run_dir, 1)
        final = wait_for_end(res.run, LocalBackend(), timeout_s=400, poll_s=0.5)
    finally:
        subprocess.run([sys.executable, "-m", "hetrun.cli", "cancel", str(run_dir)], capture_output=True, check=False)
    assert {c.state for c in final.components} == {"COMPLETED"}, final
    _assert_named(run_dir, victim, "mpirun")
    ends = _events(run_dir, "attempt_end")
    assert [(e["restart_count"], e["outcome"], e["requeued"]) for e in ends] == [(0, "failed", True), (1, "done", False)]
    restores = [e for e in _events(run_dir, "restore") if e.get("restart_count") == 1]
    assert len(restores) == 3 and all(e["step"] is not None and e["step"] >= 2 for e in restores), restores


@needs_mpirun
@pytest.mark.mpi
def test_local_rank_exiting_before_mpi_init_is_named(tmp_path: Path) -> None:
    spec = _ppo_spec("early-exit-local", iterations=4, env={"HETRUN_TEST_EXIT_BEFORE_MPI": "1:3"})
    res = submit_spec(spec, backend="local", runs_dir=tmp_path)
    run_dir = Path(res.run.run_dir)
    final = wait_for_end(res.run, LocalBackend(), timeout_s=90, poll_s=0.3)
    assert {c.state for c in final.components} == {"FAILED"}, final
    [f] = _events(run_dir, "rank_failure")
    assert (f["rank"], f["component"], f["exit_code"], f["detected_by"]) == (1, "rollout", 3, "mpirun"), f
    [end] = _events(run_dir, "attempt_end")
    assert (end["outcome"], end["requeued"]) == ("failed", False)


# -- on the local Slurm cluster ---------------------------------------------------

def _sacct_states(job_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id.split(";")[0], "-o", "State"],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _slurm_run(shared_tmp: Path, spec: Any) -> tuple[Any, Path]:
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    return res, Path(res.run.run_dir)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("rank", [0], ids=["learner"])
def test_slurm_kill_9_ends_the_job_naming_rank_component_node(
        slurm_cluster, shared_tmp: Path, rank: int) -> None:  # type: ignore[no-untyped-def]
    res, run_dir = _slurm_run(shared_tmp, _ppo_spec(f"kill-slurm-{rank}", iterations=400,
                                                    slurm={"time": "00:10:00"}))
    try:
        victim = _kill_after_first_checkpoint(run_dir, rank)
        assert wait_for(lambda: bool(_events(run_dir, "attempt_end")), 90, 0.5), "no attempt_end"
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=60, poll_s=1)
    finally:
        subprocess.run(["scancel", str(res.run.job_id).split(";")[0]], capture_output=True, check=False)
    assert {c.state for c in final.components} == {"FAILED"}, final
    assert wait_for(lambda: set(_sacct_states(str(res.run.job_id))) == {"FAILED"}, 30, 1)
    _assert_named(run_dir, victim, "srun")
    [end] = _events(run_dir, "attempt_end")
    assert (end["outcome"], end["requeued"], end["failed_ranks"]) == ("failed", False, [rank]), end
    _verify_ckpt(run_dir)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_failure_is_requeued_on_request_and_resumes(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _ppo_spec("kill-slurm-requeue", iterations=200, preemption={"max_failures": 1},
                     slurm={"time": "00:10:00"})
    res, run_dir = _slurm_run(shared_tmp, spec)
    try:
        victim = _kill_after_first_checkpoint(run_dir, 1)
        job = str(res.run.job_id).split(";")[0]

        def second_attempt_ended() -> bool:
            # The failure's requeue is the job's own (scontrol requeue), so Slurm holds it
            # cred_expire + 1 s (16 s here): released at once, the hold is not under test.
            release_if_held(job)
            return len(_events(run_dir, "attempt_end")) == 2

        assert wait_for(second_attempt_ended, 400, 0.5), _events(run_dir, "attempt_end")
    finally:
        subprocess.run(["scancel", str(res.run.job_id).split(";")[0]], capture_output=True, check=False)
    _assert_named(run_dir, victim, "srun")
    ends = _events(run_dir, "attempt_end")
    assert [(e["restart_count"], e["outcome"], e["requeued"]) for e in ends] == [(0, "failed", True), (1, "done", False)]
    restores = [e for e in _events(run_dir, "restore") if e.get("restart_count") == 1]
    assert len(restores) == 3 and all(e["step"] is not None and e["step"] >= 2 for e in restores), restores


@pytest.mark.slurm
def test_slurm_rank_exiting_before_mpi_init_is_named(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _ppo_spec("early-exit-slurm", iterations=4, env={"HETRUN_TEST_EXIT_BEFORE_MPI": "2:3"},
                     slurm={"time": "00:05:00"})
    res, run_dir = _slurm_run(shared_tmp, spec)
    try:
        assert wait_for(lambda: bool(_events(run_dir, "attempt_end")), 120, 0.5), "no attempt_end"
    finally:
        subprocess.run(["scancel", str(res.run.job_id).split(";")[0]], capture_output=True, check=False)
    [f] = _events(run_dir, "rank_failure")
    assert (f["rank"], f["component"], f["exit_code"], f["detected_by"]) == (2, "rollout", 3, "srun"), f
    assert f["node"] and f["node"].startswith("n"), f
    [end] = _events(run_dir, "attempt_end")
    assert (end["outcome"], end["requeued"]) == ("failed", False)
    assert json.dumps(end)  # plain JSON

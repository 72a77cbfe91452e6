"""`submit --wait` and `hetrun status` name the failing rank and show its own error line,
never a bare FAILED (issue 11, "around the run").

The post-mortem (hetrun.slurm_plugin.postmortem) reads the last line of the dead rank's
log into its ``rank_failure`` line (``last_line``) and the ``attempt_end`` reason; a rank
that raised is described by the runtime's own message. The end-to-end tests run a real
job whose rank prints an error and exits 3 (as a script would), on the local backend and
on the local Slurm cluster, and one whose rank raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hetrun.reports.attempts import status_details
from hetrun.slurm_plugin.postmortem import finish_attempt, last_log_line
from hetrun.slurm_plugin.rundir import append_event, events_of
from setup_tools import MPIRUN

from tests.cli_helpers import hetrun_cli, write_job

HERE = Path(__file__).parent
MPIRUN_EXITED = """\
  Process name: [[23712,1],2]
  Exit code:    3
"""
ERROR_LINE = "RuntimeError: loss is NaN at iteration 2 (injected by the test)"
EXITING_WORKLOAD = f'''\
import os
import sys

from runtime_toy import ToyRegression


class ExitsNonZero(ToyRegression):
    """Prints an error on stderr and exits 3 at iteration 2, as a failing script would."""

    def forward(self, batch, micro, num_micro):
        if self.ctx.iteration == 2:
            print("iteration 2 starting", flush=True)
            sys.stderr.write({ERROR_LINE!r} + "\\n")
            sys.stderr.flush()
            os._exit(3)
        return super().forward(batch, micro, num_micro)
'''


def _run_dir(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir()
    plan = {"components": [{"name": "learner", "ntasks": 1}, {"name": "rollout", "ntasks": 2}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return tmp_path


def test_post_mortem_carries_the_dead_ranks_last_line(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    (run_dir / "logs" / "rollout-local-2.out").write_text(f"step 1\n{ERROR_LINE}\n\n")
    (run_dir / "logs" / "rollout-local-1.out").write_text("a healthy peer\n")
    requeue, end = finish_attempt(run_dir, restart=0, exit_code=3, launcher="mpirun", log_text=MPIRUN_EXITED)
    assert not requeue and end["outcome"] == "failed" and end["failed_ranks"] == [2]
    [f] = events_of(run_dir, ("rank_failure",))
    assert (f["rank"], f["component"], f["exit_code"], f["last_line"]) == (2, "rollout", 3, ERROR_LINE), f
    assert ERROR_LINE in end["reason"] and "rank 2 (rollout)" in end["reason"], end
    counts, _lost, failure = status_details(run_dir)
    assert counts.failures == 1 and failure is not None
    assert failure.component == "rollout" and ERROR_LINE in failure.text


def test_a_rank_that_raised_is_described_by_its_exception(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    append_event(run_dir, "rank_failure", rank=0, component="learner", node="n1", signal=None, exit_code=6,
                 detected_by="runtime", restart_count=0, action="forward", iteration=3,
                 message="ValueError: bad shape")
    text = "  Process name: [[1,1],0]\n  Exit code:    6\n"
    _, end = finish_attempt(run_dir, restart=0, exit_code=6, launcher="mpirun", log_text=text)
    assert end["reason"].startswith("rank 0 (learner) on n1 failed in action forward (iteration 3): "
                                    "ValueError: bad shape"), end
    assert len(events_of(run_dir, ("rank_failure",))) == 1  # the runtime's line only


def test_a_command_components_own_failure_line_carries_its_last_line(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)  # runtime/command_rank.py writes this for a program that exits 3
    append_event(run_dir, "rank_failure", rank=1, component="rollout", node="n2", signal=None, exit_code=3,
                 message="train.py exited with code 3", last_line="bad batch: giving up",
                 detected_by="runtime", command=True, restart_count=0)
    text = "  Process name: [[1,1],1]\n  Exit code:    3\n"
    _, end = finish_attempt(run_dir, restart=0, exit_code=3, launcher="mpirun", log_text=text)
    assert end["reason"].startswith("rank 1 (rollout) on n2 failed: train.py exited with code 3; "
                                    "its last line: bad batch: giving up"), end


def test_log_of_another_component_with_a_longer_name_is_not_read(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    (run_dir / "logs" / "a-1-17-0.out").write_text("not mine\n")
    assert last_log_line(run_dir, "a", 0) == ""
    (run_dir / "logs" / "a-17-0.out").write_text("mine\n")
    assert last_log_line(run_dir, "a", 0) == "mine"
    assert last_log_line(run_dir, "a", 1) == "" and last_log_line(run_dir, None, 0) == ""


def test_status_shows_no_failure_for_a_run_that_did_not_fail(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    append_event(run_dir, "attempt_end", restart_count=0, outcome="done", requeued=False, reason="all ranks exited 0")
    assert status_details(run_dir)[2] is None


# -- real jobs -------------------------------------------------------------------------

def _job(job_dir: Path, name: str, workload: str, args: dict[str, Any], slurm: dict[str, Any] | None) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "runtime_toy.py").write_text((HERE / "runtime_toy.py").read_text())
    (job_dir / "exiting_toy.py").write_text(EXITING_WORKLOAD)
    doc = {
        "name": name, "workload": workload, "workload_args": args,
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "sync", "optimize"]}},
        "training": {"kind": "supervised", "iterations": 6, "micro_batches": 1, "pipeline_window": 1, "seed": 0},
        "checkpoint": {"interval": 0},
        "env": {"OMP_NUM_THREADS": "1", "HETRUN_COLLECTIVE_TIMEOUT": "900"},
        **({"slurm": slurm} if slurm else {}),
    }
    return write_job(job_dir, doc)


def _submit_wait(job: Path, backend: str, runs: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    proc = hetrun_cli("submit", str(job), "--backend", backend, "--runs-dir", str(runs), "--wait",
                      "--wait-timeout", "240")
    run_dir = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("run directory: "))
    return proc, Path(run_dir)


def _assert_error_line_shown(proc: subprocess.CompletedProcess[str], run_dir: Path, runs: Path) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    final = [line for line in proc.stderr.splitlines() if " ended FAILED: " in line]
    assert final and "rank 0 (learner)" in final[-1] and "exit code 3" in final[-1] \
        and ERROR_LINE in final[-1], proc.stderr
    status = hetrun_cli("status", str(run_dir), "--runs-dir", str(runs), timeout=60)
    assert status.returncode == 0, status.stderr
    # The REASON column may wrap: each word of the error line is there.
    for word in ("FAILED", "rank", "(learner)", "NaN", "injected"):
        assert word in status.stdout, status.stdout


needs_mpirun = MPIRUN


@needs_mpirun
@pytest.mark.mpi
def test_local_submit_wait_and_status_show_the_failing_ranks_line(tmp_path: Path) -> None:
    job = _job(tmp_path / "job", "exits-local", "exiting_toy:ExitsNonZero", {}, None)
    proc, run_dir = _submit_wait(job, "local", tmp_path / "runs")
    _assert_error_line_shown(proc, run_dir, tmp_path / "runs")
    [f] = events_of(run_dir, ("rank_failure",))
    assert (f["detected_by"], f["last_line"]) == ("mpirun", ERROR_LINE), f


@needs_mpirun
@pytest.mark.mpi
def test_local_rank_that_raises_shows_its_exception(tmp_path: Path) -> None:
    job = _job(tmp_path / "job", "raises-local", "runtime_toy:ToyRegression",
               {"fail_at": 2, "fail_component": "learner"}, None)
    proc, run_dir = _submit_wait(job, "local", tmp_path / "runs")
    assert proc.returncode == 1
    # The action may be a fused one (forward.m0+backward.m0+...): its name starts with forward.
    assert "rank 0 (learner)" in proc.stderr and "failed in action forward" in proc.stderr \
        and "(iteration 2): ValueError: toy failure injected at iteration 2" in proc.stderr, proc.stderr
    status = hetrun_cli("status", str(run_dir), "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert "ValueError:" in status.stdout and "injected" in status.stdout, status.stdout


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_submit_wait_and_status_show_the_failing_ranks_line(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    job = _job(shared_tmp / "job", "exits-slurm", "exiting_toy:ExitsNonZero", {},
               {"partition": "debug", "time": "00:05:00"})
    runs = shared_tmp / "runs"
    proc, run_dir = _submit_wait(job, "sbatch", runs)
    try:
        _assert_error_line_shown(proc, run_dir, runs)
        [f] = events_of(run_dir, ("rank_failure",))
        assert (f["detected_by"], f["last_line"]) == ("srun", ERROR_LINE), f
    finally:
        job_id = json.loads((run_dir / "run.json").read_text()).get("job_id") if (run_dir / "run.json").is_file() else None
        if job_id:
            subprocess.run(["scancel", str(job_id).split(";")[0]], capture_output=True, check=False)


def test_the_max_failures_hint_only_where_a_requeue_could_help(tmp_path: Path) -> None:
    """Issue 24: a rank's own exception would recur on a restart: no 'set max_failures' hint;
    a rank killed by a signal (a node, the OOM killer) could be helped by a requeue: the hint."""
    (tmp_path / "raised").mkdir()
    (tmp_path / "killed").mkdir()
    raised = _run_dir(tmp_path / "raised")
    append_event(raised, "rank_failure", rank=0, component="learner", node="n1", signal=None, exit_code=6,
                 detected_by="runtime", restart_count=0, action="forward", iteration=3, message="ValueError: x")
    _, end = finish_attempt(raised, restart=0, exit_code=6, launcher="mpirun", log_text="")
    assert "max_failures" not in end["reason"] and "would most likely recur" in end["reason"], end
    # The same on Slurm: a command script that raised exits 1, and srun also reports that exit.
    (tmp_path / "exited").mkdir()
    exited = _run_dir(tmp_path / "exited")
    append_event(exited, "start", rank=0, component="learner", node="n1", comp_rank=0, restart_count=0)
    append_event(exited, "rank_failure", rank=0, component="learner", node="n1", signal=None, exit_code=1,
                 detected_by="runtime", restart_count=0, command=True,
                 message="python3 exited with code 1; its last line: ValueError: bad config value")
    srun_log = "srun: error: n1: task 0: Exited with exit code 1\nhetrun: first task death seen, SIGKILL to the " \
               "other tasks of the step\nsrun: error: n2: task 0: Killed\n"
    _, end = finish_attempt(exited, restart=0, exit_code=1, launcher="srun", log_text=srun_log)
    assert "max_failures" not in end["reason"] and "would most likely recur" in end["reason"], end
    assert "ValueError: bad config value" in end["reason"], end
    killed = _run_dir(tmp_path / "killed")
    append_event(killed, "rank_failure", rank=1, component="rollout", node="n2", signal="SIGKILL", exit_code=None,
                 detected_by="runtime", restart_count=0, message="python3 killed by SIGKILL", command=True)
    _, end = finish_attempt(killed, restart=0, exit_code=9, launcher="srun", log_text="")
    assert "set it above 0 to requeue failures" in end["reason"], end


def test_a_clean_preemption_is_said_to_be_one_in_the_launcher_s_log(tmp_path: Path) -> None:
    from hetrun.slurm_plugin.postmortem import clean_stop_note, main

    assert clean_stop_note({"outcome": "time_limit", "stop_ignored": [0], "restart_count": 0}) is None
    assert clean_stop_note({"outcome": "failed", "restart_count": 0}) is None

    run_dir = _run_dir(tmp_path)
    for rank, comp in ((0, "learner"), (1, "rollout"), (2, "rollout")):
        append_event(run_dir, "start", rank=rank, component=comp, restart_count=0)
        append_event(run_dir, "exit", rank=rank, component=comp, restart_count=0, code=143)
    log = run_dir / "logs" / "srun-7-0.err"
    log.write_text("srun: forcing job termination\nsrun: error: n1: task 0: Exited with exit code 143\n")
    assert main([str(run_dir), "--exit-code", "143", "--signal", "TERM", "--log", str(log), "--launcher", "mpirun"]) == 0
    said = log.read_text().splitlines()[-1]
    assert said.startswith("hetrun: attempt 0 stopped cleanly (preempted): the ranks saved their checkpoint and "
                           "exited 143 as asked") and "not a crash" in said, said


def test_a_clean_stop_never_claims_a_checkpoint_that_is_not_saved(capsys: pytest.CaptureFixture[str]) -> None:
    from hetrun.runtime import preempt

    preempt.say_clean_stop("trainer", 0, preempt.EXIT_TERMINATED, 7)
    saved = capsys.readouterr().err
    assert "its checkpoint at step 7 is saved" in saved and "not a crash" in saved
    preempt.say_clean_stop("trainer", 0, preempt.EXIT_TERMINATED, None, saved=False)
    unsaved = capsys.readouterr().err
    assert "its checkpoint" not in unsaved and "no checkpoint of this stop is saved" in unsaved


def _script_end(run_dir: Path, srun_rc: int) -> subprocess.CompletedProcess[str]:
    """The rendered batch script's last lines (the post-mortem, the requeue, the exit), run by
    bash with the real post-mortem, after an srun that ended with ``srun_rc``."""
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.batch_request import slurm_options
    from hetrun.slurm_plugin.render import _postmortem_lines

    # max_failures 0: a failed attempt ends the job here (no scontrol requeue of a job that is not).
    spec = spec_from_dict({"name": "t", "components": {"learner": {"command": ["python3", "t.py"]}}})
    lines = _postmortem_lines(slurm_options(spec), sys.executable)
    log = run_dir / "logs" / "srun-7-0.err"
    log.write_text("srun: error: n1: task 0: Killed\n")
    driver = "\n".join(["set -u", f"_hetrun_rc={srun_rc}", "_hetrun_sig=''", f"_hetrun_srun_log={log}",
                        f"HETRUN_RUN_DIR={run_dir}", *lines])
    return subprocess.run(["bash", "-c", driver], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "SLURM_RESTART_COUNT": "0"})


def test_a_step_whose_ranks_all_exited_0_ends_the_job_completed_though_srun_was_killed(tmp_path: Path) -> None:
    """srun ended with 137 after every rank's clean exit (the monitor ends an srun that outlives
    them; seen once in the suite: a node-death run that trained to its end, bit-identical, ended
    FAILED 137). The post-mortem reads the exit events: done, and the batch script exits 0. One
    rank short of its exit event, it is a failure with srun's code, as before."""
    (tmp_path / "all").mkdir()
    (tmp_path / "short").mkdir()
    run_dir = _run_dir(tmp_path / "all")
    for rank, comp in ((0, "learner"), (1, "rollout"), (2, "rollout")):
        append_event(run_dir, "start", rank=rank, component=comp, restart_count=0)
        append_event(run_dir, "exit", rank=rank, component=comp, restart_count=0, code=0)
    done = _script_end(run_dir, 137)
    assert done.returncode == 0, done.stderr
    assert "attempt 0 ended: done" in done.stderr, done.stderr
    short = _run_dir(tmp_path / "short")
    for rank, comp in ((0, "learner"), (1, "rollout"), (2, "rollout")):
        append_event(short, "start", rank=rank, component=comp, restart_count=0)
        if rank < 2:
            append_event(short, "exit", rank=rank, component=comp, restart_count=0, code=0)
    failed = _script_end(short, 137)
    assert failed.returncode == 137 and "attempt 0 ended: failed" in failed.stderr, failed.stderr

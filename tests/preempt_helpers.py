"""Preempt a running hetrun job on the shared local Slurm cluster and wait for its end: the one
block the command, stop and mixed-job Slurm tests share.

A job in ``high`` that wants our first node exclusively makes Slurm preempt (requeue) ours;
the preemptor sleeps 2 s, so the requeued job starts again soon after.

Slurm holds a requeued job ``cred_expire + 1`` s after it ended (slurm_plugin/requeue_hold.py).
A hetrun job preempted through ``high`` shortens that itself (its post-mortem); for every other
requeue (a plain sbatch script, ``hetrun preempt``'s exit 85, a slow completion) the tests here
release the held job at once with ``release_if_held`` (``scontrol update StartTime=now``, what the
job's owner may do). tests/test_requeue_hold.py is the one test that keeps the hold and checks it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from hetrun.slurm_plugin.backends.base import RunStatus
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.requeue_hold import parse_show_job
from hetrun.slurm_plugin.rundir import RunInfo, wait_for
from hetrun.slurm_plugin.submit import is_finished


def first_node(job: str) -> str:
    """The first node of ``job``'s allocation (scontrol's NodeList, expanded)."""
    from hetrun.runtime.api.env import first_host

    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    nodelist = next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeList=")), "")
    node = first_host(nodelist)
    assert node and node != "(null)", out
    return node


def show_job(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    return parse_show_job(out)


def _epoch(slurm_time: str) -> float | None:
    try:
        return datetime.fromisoformat(slurm_time).timestamp()  # local time, as scontrol prints it
    except ValueError:
        return None


def release_if_held(job: str) -> bool:
    """If Slurm holds requeued ``job`` (PENDING, Reason=BeginTime, eligible later): make it eligible
    now, as its owner may (a het job's leader id releases every component). True when released.

    Only after the requeue has finished (SubmitTime is reset then) and a second later, so that the
    new launch credential is dated after the old one's revocation, as Slurm's hold intends."""
    info = show_job(job)
    if info.get("JobState") != "PENDING" or info.get("Reason") != "BeginTime" or info.get("Restarts", "0") == "0":
        return False
    now = time.time()
    eligible, requeued = _epoch(info.get("EligibleTime", "")), _epoch(info.get("SubmitTime", ""))
    if eligible is None or requeued is None or eligible <= now + 1 or now < requeued + 1:
        return False
    return subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True,
                          text=True).returncode == 0


def wait_for_end_releasing(run: RunInfo, *, timeout_s: float, poll_s: float = 1.0) -> RunStatus:
    """``submit.wait_for_end``, releasing the job from Slurm's requeue hold whenever it is held."""
    backend, job = SbatchBackend(), str(run.job_id)
    deadline = time.monotonic() + timeout_s
    while True:
        release_if_held(job)
        status = backend.status([run])[run.run_dir]
        if is_finished(status):
            return status
        assert time.monotonic() < deadline, f"run still {status.state} after {timeout_s:g} s: {show_job(job)}"
        time.sleep(poll_s)


def preempt_through_high(node: str, shared: Path) -> None:
    """A job in ``high`` that wants the whole node: Slurm preempts (requeues) ours."""
    subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-t", "00:02:00",
                    "-J", "cmd-preemptor", f"--output={shared}/preemptor-%j.out", "--wrap", "sleep 2"],
                   capture_output=True, text=True, check=True)


def preempt_at_and_wait(run: RunInfo, shared: Path, *ready: Callable[[], bool], context: Callable[[], Any],
                        ready_s: float = 240, poll_s: float = 0.5, end_s: float = 300) -> RunStatus:
    """Preempt ``run`` once each ``ready()`` holds (in order), then wait for its end (``end_s``);
    the job is cancelled whatever happens. ``context()`` is shown when a ``ready`` never holds."""
    job = str(run.job_id)
    try:
        for cond in ready:
            assert wait_for(cond, ready_s, poll_s), context()
            preempt_through_high(first_node(job), shared)
        return wait_for_end_releasing(run, timeout_s=end_s)
    finally:
        subprocess.run(["scancel", job], check=False, capture_output=True)

"""Preempt a running hetrun job on the shared local Slurm cluster and wait for its end: the one
block the command, stop and mixed-job Slurm tests share.

A job in ``high`` that wants our first node exclusively makes Slurm preempt (requeue) ours;
the preemptor sleeps 2 s, so the requeued job starts again soon after.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetrun.slurm_plugin.backends.base import RunStatus
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import RunInfo, wait_for
from hetrun.slurm_plugin.submit import wait_for_end


def first_node(job: str) -> str:
    """The first node of ``job``'s allocation (scontrol's NodeList, expanded)."""
    from hetrun.runtime.api.env import first_host

    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    nodelist = next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeList=")), "")
    node = first_host(nodelist)
    assert node and node != "(null)", out
    return node


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
        return wait_for_end(run, SbatchBackend(), timeout_s=end_s, poll_s=1)
    finally:
        subprocess.run(["scancel", job], check=False, capture_output=True)

"""Slurm's hold on a requeued job, and hetrun shortening it for its own job.

What sets the hold (Slurm 22.05, src/slurmctld/job_mgr.c): a requeued batch job
is first PENDING|COMPLETING while its processes end; when the last one has
ended, ``batch_requeue_fini()`` sets its begin time to *now + the job
credential lifetime + 1 s*, **unless the job's begin time is already later
than now**. The credential lifetime is slurm.conf's ``AuthInfo=cred_expire``
(default 120 s, minimum 5; `hetrun cluster up` renders 15). Slurm waits so that
the new launch credential is dated after the nodes revoked the old one (a
1-second clock) and the old job's sockets and credential are purged: the
requeued job shows ``Reason=BeginTime`` and ``EligibleTime = SubmitTime +
cred_expire + 1`` (SubmitTime is reset to the end of the requeue).
Slurm 25.11 adds ``SchedulerParameters=requeue_delay`` for this; 22.05 has none.

What the job's owner may do: update the begin time of their own pending job
(``scontrol update JobId=J StartTime=...``, allowed to the owner in
``_update_job``; a het job's leader id updates every component). Between the
requeue and the end of completing the job is already PENDING (its base state),
so hetrun's post-mortem — in the batch shell, after the ranks have saved and
exited — sets its own job's begin time ``SHORTEN_TO_S`` seconds ahead; Slurm
then keeps that time instead of adding the hold. The new start is still dated
after the old credential's revocation (the post-mortem runs after it) and
Slurm still starts nothing before every process of the old attempt has ended.
When completing ends after that begin time, Slurm's own hold applies, as
without hetrun; so the begin time also waits for slurmd's next check that the
killed job's processes are gone (``begin_delay_s``). hetrun does this only for the job it runs in, only when Slurm
requeued it (an update of a job that is not pending is refused), and says so:
a ``requeue_hold_shortened`` event and a line in the batch log. A job whose
environment sets ``HETRUN_KEEP_REQUEUE_HOLD=1`` keeps Slurm's hold (the
benchmark's side-by-side peer; a site that wants its hold kept).
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from .rundir import append_event

# Seconds from the post-mortem to the requeued job's begin time, at least: enough
# for the batch shell to exit and every node to report the job complete (under
# 1 s on the idle local cluster), so that Slurm keeps this time rather than
# adding its own hold.
SHORTEN_TO_S = 4
# When slurmd looks whether a killed job's processes are gone, in seconds after
# the kill (Slurm 22.05 src/slurmd/slurmd/req.c, _pause_for_job_completion with
# KillWait 30): every second for the first ~11 s, then at ~21 s and at KillWait.
# Ranks that need longer than ~10 s to save and exit complete only at ~21 s.
SLURMD_COMPLETION_CHECKS_S = (*range(1, 12), 21, 30)
KEEP_ENV = "HETRUN_KEEP_REQUEUE_HOLD"

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def shorten_own_hold(job_id: str, run_dir: Path | None, *, restart: int, delay_s: int = SHORTEN_TO_S,
                     run: Runner = subprocess.run) -> dict[str, Any] | None:
    """Set requeued ``job_id``'s begin time ``delay_s`` seconds ahead (see the module doc).

    Call it only from inside ``job_id`` itself, after Slurm requeued it (preemption,
    PreemptMode=REQUEUE) or after its own ``scontrol requeue``. Returns the event
    written (``requeue_hold_shortened``), or None when Slurm refused (the job was
    not requeued, e.g. cancelled), scontrol is missing or ``HETRUN_KEEP_REQUEUE_HOLD`` is set."""
    if not job_id.isdigit() or os.environ.get(KEEP_ENV, "") not in ("", "0"):
        return None
    asked = time.time()
    delay_s = begin_delay_s(asked, killed_at(job_id, run), delay_s)
    if not _own_update(run, job_id, f"StartTime=now+{int(delay_s)}"):
        return None
    fields = {"job_id": job_id, "restart_count": restart, "begin_at": round(asked + delay_s, 3),
              "delay_s": delay_s,
              "message": f"job {job_id} was requeued; as its owner hetrun set its begin time to {delay_s} s "
                         f"from now (scontrol update JobId={job_id} StartTime=now+{delay_s}) instead of "
                         "Slurm's hold (AuthInfo cred_expire + 1 s after the job ends)"}
    if run_dir is not None:
        try:
            return append_event(run_dir, "requeue_hold_shortened", **fields)
        except OSError:
            pass
    return {"ev": "requeue_hold_shortened", **fields}


def _own_update(run: Runner, job_id: str, setting: str) -> bool:
    """``scontrol update JobId=job_id SETTING``, the job's owner updating it; False: Slurm refused
    (the job is not pending), or scontrol is missing or hung."""
    try:
        proc = run(["scontrol", "update", f"JobId={job_id}", setting], capture_output=True, text=True,
                   check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def release_named_nodes(job_id: str, run_dir: Path, *, run: Runner = subprocess.run) -> list[str]:
    """Clear the nodes placement named (plan.json ``placement.nodelist``, a start by preemption)
    from requeued ``job_id``'s components: Slurm keeps a job's ``--nodelist`` across a requeue,
    and the jobs it named have long been preempted; the next start goes wherever Slurm or
    preemption finds nodes. The job's own update, while it is pending (as ``shorten_own_hold``).
    Returns the job ids cleared (a het component is ``<leader>+<offset>``)."""
    from hetrun.errors import HetrunError
    from hetrun.planfile import read_plan

    if not job_id.isdigit():
        return []
    try:
        comps = read_plan(run_dir).raw.get("components") or []
    except HetrunError:  # no plan, or one the post-mortem has said is broken: nothing named
        return []
    targets = [job_id if len(comps) == 1 else f"{job_id}+{i}" for i, comp in enumerate(comps)
               if (comp.get("placement") or {}).get("nodelist")]
    return [t for t in targets if _own_update(run, t, "ReqNodeList=")]


def begin_delay_s(now: float, killed: float | None, least: int = SHORTEN_TO_S) -> int:
    """Seconds from ``now`` (the post-mortem) to a begin time Slurm will keep: after slurmd's
    first completion check once the batch shell has ended (~1 s from now), + 2 s; ``least`` at
    least. ``killed``: when Slurm killed the attempt (None: unknown, ``least``)."""
    if killed is None:
        return least
    gone = now + 1 - killed
    check = next((c for c in SLURMD_COMPLETION_CHECKS_S if c >= gone), gone)
    return max(least, math.ceil(killed + check + 2 - now))


def killed_at(job_id: str, run: Runner = subprocess.run) -> float | None:
    """When Slurm ended ``job_id``'s newest requeued or preempted attempt (accounting's End,
    1 s resolution), or None when accounting does not have it (yet)."""
    try:
        out = run(["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", "State,End"],
                  capture_output=True, text=True, check=False, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    ends = []
    for line in out.splitlines():
        state, _, end = line.partition("|")
        if state.startswith(("REQUEUED", "PREEMPTED")):
            try:
                ends.append(datetime.fromisoformat(end.strip()).timestamp())  # local time, as sacct prints
            except ValueError:
                continue
    return max(ends, default=None)


def parse_show_job(text: str) -> dict[str, str]:
    """``scontrol -o show job`` of one job (its first line: a het job's leader) as KEY -> value."""
    first = text.splitlines()[0] if text.strip() else ""
    return dict(w.split("=", 1) for w in first.split() if "=" in w)


def cred_expire_s(show_config: str) -> int:
    """``AuthInfo``'s cred_expire from ``scontrol show config`` (Slurm's default 120 when unset)."""
    for line in show_config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AuthInfo":
            for part in value.strip().split(","):
                name, _, number = part.strip().partition("=")
                if name == "cred_expire" and number.isdigit():
                    return int(number)
    return 120

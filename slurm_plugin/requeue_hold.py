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
If completing takes longer than ``SHORTEN_TO_S``, Slurm's own hold applies, as
without hetrun. hetrun does this only for the job it runs in, only when Slurm
requeued it (an update of a job that is not pending is refused), and says so:
a ``requeue_hold_shortened`` event and a line in the batch log.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .rundir import append_event

# Seconds from the post-mortem to the requeued job's begin time: enough for the
# batch shell to exit and every node to report the job complete (under 1 s on
# the idle local cluster; more under load and with many nodes), so that Slurm
# keeps this time rather than adding its own hold.
SHORTEN_TO_S = 5

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def shorten_own_hold(job_id: str, run_dir: Path | None, *, restart: int, delay_s: int = SHORTEN_TO_S,
                     run: Runner = subprocess.run) -> dict[str, Any] | None:
    """Set requeued ``job_id``'s begin time ``delay_s`` seconds ahead (see the module doc).

    Call it only from inside ``job_id`` itself, after Slurm requeued it (preemption,
    PreemptMode=REQUEUE) or after its own ``scontrol requeue``. Returns the event
    written (``requeue_hold_shortened``), or None when Slurm refused (the job was
    not requeued, e.g. cancelled) or scontrol is missing."""
    if not job_id.isdigit():
        return None
    asked = time.time()
    try:
        proc = run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{int(delay_s)}"],
                   capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
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

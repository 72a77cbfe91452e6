"""Preemption: turn a signal or an approaching time limit into "stop at the next
action boundary, checkpoint, exit".

The executor asks ``stop_level(ctx)`` (a local check: 0 go on, 1 requeue,
2 SIGTERM) at every action boundary and puts it into its per-iteration stop
agreement (a non-blocking MAX all-reduce over every rank, see
``hetrun.runtime.api.stop.IterationAgreement``, the run API's); once it says stop,
``agree(level)`` tells this module what all ranks agreed on, every rank stops
before the same iteration, all checkpoint together
(``resume.save_checkpoint``) and exit with the same ``exit_code(ctx)``:

- 85 after the job's warning signal (``--signal=B:USR1@<grace>``, forwarded
  by the batch script) or a time limit seen coming: the script turns 85 into
  ``scontrol requeue`` (up to ``preemption.max_restarts``);
- 143 after SIGTERM: Slurm itself is preempting (or cancelling) the job and
  requeues it by its own policy, so the runtime simply exits.

The signal handler only sets a flag (no I/O, no locks: a handler may run
between any two bytecodes) and chains a Python handler that was installed
before. We handle the configured signal (USR1 by default) and SIGTERM only;
NCCL and torch install handlers for SIGSEGV/SIGABRT and friends, which we
leave alone. A hard deadline (grace time minus a margin) exits with the code
above if the agreement and checkpoint cannot finish in time: the newest
complete checkpoint is then what a restart restores.

Without any signal: the remaining time limit (``SLURM_JOB_END_TIME`` or
``squeue -o %L`` once) is compared at every boundary with the measured cost of
a checkpoint times a safety factor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from hetrun.errors import RuntimeFailure
from hetrun.planfile import PreemptionSection
from hetrun.rundir import DEFAULTS

EXIT_REQUEUE = 85
EXIT_TERMINATED = 128 + signal.SIGTERM
SAFETY_FACTOR = 3.0
SAFETY_MARGIN_S = 10.0
DEFAULT_CKPT_COST_S = 5.0
TERM_GRACE_S = 20.0  # Slurm's default KillWait is 30 s between SIGTERM and SIGKILL
_ALLOWED = {"USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2, "TERM": signal.SIGTERM,
            "INT": signal.SIGINT, "HUP": signal.SIGHUP, "URG": signal.SIGURG, "QUIT": signal.SIGQUIT,
            "ALRM": signal.SIGALRM, "XCPU": signal.SIGXCPU}


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.signum: int | None = None  # first signal received
        self.received_at: float | None = None
        self.reason: str | None = None
        self.previous: dict[int, Any] = {}
        self.deadline: float | None = None  # job end (epoch seconds), if known
        self.deadline_checked = False
        self.watchdog: threading.Timer | None = None
        self.grace_s = float(DEFAULTS.grace_seconds)
        self.on_hard_deadline: Any = None
        self.agreed_level: int | None = None  # max over all ranks, once agreed


_S = _State()


def _handler(signum: int, frame: Any) -> None:
    if _S.signum is None:
        _S.signum = signum
        _S.received_at = time.time()
    prev = _S.previous.get(signum)
    if callable(prev):
        prev(signum, frame)


def preemption_settings(ctx: Any) -> PreemptionSection:
    """The job's ``preemption`` section (its defaults without a plan: a script hetrun did not submit)."""
    plan = getattr(ctx, "plan", None)
    return plan.preemption if plan is not None else PreemptionSection()


def warning_signal(ctx: Any) -> int:
    name = preemption_settings(ctx).signal.upper().removeprefix("SIG")
    if name not in _ALLOWED:
        raise RuntimeFailure(f"preemption.signal={name!r} is not supported",
                             hint=f"use one of {', '.join(_ALLOWED)}")
    return _ALLOWED[name]


def install(ctx: Any) -> None:
    """Install the handlers (main thread, once). Called by ``resume.restore_if_any``
    before the loop so that an early signal is not fatal (USR1's default action
    terminates the process)."""
    if _S.installed or threading.current_thread() is not threading.main_thread():
        return
    _S.grace_s = float(preemption_settings(ctx).grace_seconds)
    for signum in {warning_signal(ctx), signal.SIGTERM}:
        prev = signal.signal(signum, _handler)
        if prev is not _handler:
            _S.previous[signum] = prev
    _S.installed = True


def uninstall() -> None:
    """Restore the previous handlers and forget any request (tests, embedding)."""
    for signum, prev in _S.previous.items():
        signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
    if _S.watchdog is not None:
        _S.watchdog.cancel()
    _S.__init__()  # type: ignore[misc]


def _job_end_time() -> float | None:
    end = os.environ.get("SLURM_JOB_END_TIME")
    if end and end.isdigit():
        return float(end)
    job = os.environ.get("SLURM_JOB_ID")
    if not job or not job.isdigit():
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    left = parse_time_left(out)
    return time.time() + left if left is not None else None


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` (first line; ``UNLIMITED``/``NOT_SET`` -> None)."""
    from hetrun.dag.validators import duration_seconds

    seconds = duration_seconds(text.strip().splitlines()[0] if text.strip() else "")
    return None if seconds is None else float(seconds)


def _checkpoint_cost() -> float:
    from hetrun.runtime import resume

    return resume.measured_checkpoint_cost() or DEFAULT_CKPT_COST_S


def hard_deadline_s(signum: int | None, grace_s: float) -> float:
    """Seconds a rank has after the stop signal ``signum`` before it exits no matter what:
    SIGTERM (Slurm's preemption/cancel) leaves TERM_GRACE_S, a warning signal the grace
    time minus a margin; ``HETRUN_PREEMPT_DEADLINE_S`` overrides both. One rule for the
    API's watchdog and the command wrapper (runtime/command_stop.py)."""
    if os.environ.get("HETRUN_PREEMPT_DEADLINE_S"):
        return float(os.environ["HETRUN_PREEMPT_DEADLINE_S"])
    return TERM_GRACE_S if signum == signal.SIGTERM else max(1.0, grace_s - 5.0)


def _arm_watchdog(code: int) -> None:
    """After the grace time (minus a margin) exit no matter what: a rank stuck in
    the agreement must not be SIGKILLed in the middle of nothing. Whatever was
    committed before is intact; the restart restores the newest complete one."""
    if _S.watchdog is not None:
        return
    budget = hard_deadline_s(_S.signum, _S.grace_s)

    def fire() -> None:
        cb = _S.on_hard_deadline
        if cb is not None:
            with contextlib.suppress(Exception):  # exiting is what matters now
                cb(code, budget)
        os._exit(code)

    _S.watchdog = threading.Timer(budget, fire)
    _S.watchdog.daemon = True
    _S.watchdog.start()


def should_stop(ctx: Any) -> bool:
    """Local check at an action boundary: a signal arrived, or the time limit is
    closer than a checkpoint costs (times a safety factor)."""
    if not _S.installed:
        install(ctx)
    if _S.signum is not None:
        if _S.reason is None:
            _S.reason = "SIGTERM" if _S.signum == signal.SIGTERM else f"signal {signal.Signals(_S.signum).name}"
            _arm_watchdog(_code())
        return True
    if not _S.deadline_checked:
        _S.deadline_checked = True
        _S.deadline = _job_end_time()
    if _S.deadline is not None:
        left = _S.deadline - time.time()
        if left < SAFETY_FACTOR * _checkpoint_cost() + SAFETY_MARGIN_S:
            _S.reason = f"time limit in {left:.0f}s"
            return True
    return False


LEVEL_NONE, LEVEL_REQUEUE, LEVEL_TERMINATED = 0, 1, 2


def stop_level(ctx: Any) -> int:
    """``should_stop`` as a number the ranks can MAX-reduce: 0 go on, 1 stop and
    ask for a requeue (warning signal, time limit), 2 stop because of SIGTERM."""
    if not should_stop(ctx):
        return LEVEL_NONE
    return LEVEL_TERMINATED if _S.signum == signal.SIGTERM else LEVEL_REQUEUE


def agree(level: int) -> None:
    """The stop all ranks agreed on (the MAX of their ``stop_level``).

    Every rank then exits with the same code, also a rank that never got a
    signal itself (``kill -USR1`` on one pid), and arms the hard deadline:
    from now on it too must be gone before the grace time is over.
    """
    if level <= LEVEL_NONE:
        return
    _S.agreed_level = max(level, _S.agreed_level or 0)
    if _S.reason is None:
        _S.reason = "SIGTERM on another rank" if level == LEVEL_TERMINATED else "stop agreed with other ranks"
    _arm_watchdog(_code())


def stop_reason() -> str | None:
    return _S.reason


def requested_by_signal() -> int | None:
    return _S.signum


def exit_code(ctx: Any) -> int:
    """85 (requeue me) unless Slurm's own SIGTERM ended the job (143). Waits for
    the checkpoint in flight first: exiting earlier would lose it."""
    from hetrun.runtime import resume

    resume.flush(ctx)
    return _code()


def say_clean_stop(component: str, rank: int, code: int, resume_at: int | None, *, saved: bool = True) -> None:
    """One line in the rank's own log (stderr) before an agreed stop's exit: the launcher's
    "Exited with exit code 143" that follows reads like a crash; this says it was not.
    ``saved``: whether this stop's checkpoint is on disk (False: the script never saved, or
    the last write failed) -- the line never claims a checkpoint that is not there."""
    why = "preemption (SIGTERM)" if code == EXIT_TERMINATED else "requeue (warning signal or time limit)"
    if saved:
        at = f" at step {resume_at}" if resume_at is not None else ""
        state = f"its checkpoint{at} is saved; exiting {code} so the job can be requeued and resume there"
    else:
        state = (f"no checkpoint of this stop is saved (the script saved none, or the last write failed): "
                 f"exiting {code}; a requeued run resumes from the newest checkpoint in the store, if any")
    sys.stderr.write(f"hetrun: rank {rank} ({component}) stopped cleanly for {why}: {state} (not a crash: "
                     f"srun's 'Exited with exit code {code}' below reports this exit; a scancel stays "
                     "cancelled)\n")
    sys.stderr.flush()


def _code() -> int:
    if _S.agreed_level is not None:
        return EXIT_TERMINATED if _S.agreed_level >= LEVEL_TERMINATED else EXIT_REQUEUE
    return EXIT_TERMINATED if _S.signum == signal.SIGTERM else EXIT_REQUEUE


def set_hard_deadline_callback(cb: Any) -> None:
    _S.on_hard_deadline = cb

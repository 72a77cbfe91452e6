"""The stop signals of a command component's rank: forwarded once, and enforced at the hard deadline.

``hetrun.runtime.command_rank`` runs the user's program as a child and waits
for it here. Two things this module does that a plain ``Popen.wait`` cannot:

- **Each signal reaches the program once.** Slurm's slurmstepd signals every
  process of a job step (the wrapper and its child alike), and the local
  backend signals the wrapper's whole process group: forwarding those too made
  the program get every USR1 and SIGTERM twice (measured on the local Slurm
  cluster: USR1 from slurmstepd and again from the wrapper). The wrapper
  blocks the signals and takes them with ``sigtimedwait``, which says who sent
  each one: a signal from the wrapper's parent (slurmstepd, the local
  supervisor) or from the kernel (a terminal's Ctrl-C, to the foreground
  process group) already reached the program; only one from anyone else (a
  user's ``kill`` of the wrapper's pid) is forwarded.
- **A program that ignores the stop is ended at the hard deadline, and said
  so.** After the first stop signal (USR1/USR2: the warning before a time limit
  or ``hetrun preempt``; SIGTERM/SIGINT: Slurm preempting or cancelling) the
  program has the run API's budget (``hetrun.runtime.preempt``:
  ``grace_seconds - 5`` s after the warning, 20 s after SIGTERM) plus
  ``DEADLINE_MARGIN_S`` (the API's own watchdog ends a program that does stop,
  a little late, first). The rank writes a ``stop_signal`` event when the first
  stop signal arrives. A program still running at the deadline gets SIGTERM (if
  it has not had one), SIGKILL ``KILL_AFTER_S`` later, and the rank writes a
  ``stop_ignored`` event (signal, when it was delivered, for how long it was
  ignored, how it was killed, the work lost since the newest checkpoint) and
  exits with the API's code: 85 (requeue) after the warning, 143 after SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrun.runtime import preempt
from hetrun.runtime.events import EventLog, read_events

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)
_WATCHED = (*FORWARDED, signal.SIGCHLD)
DEADLINE_MARGIN_S = 3.0
KILL_AFTER_S = 2.0
_IDLE_WAIT_S = 1.0  # a wake-up now and then in case a SIGCHLD was merged or lost


def stop_budget(signum: int, grace_seconds: float) -> float:
    """Seconds the program has after ``signum`` before the wrapper ends it: the run API's
    own hard deadline (preempt.hard_deadline_s, the same rule) plus the margin."""
    return preempt.hard_deadline_s(signum, grace_seconds) + DEADLINE_MARGIN_S


def child_signals() -> None:
    """In the child before exec: the watched signals unblocked again (the mask is
    inherited), the warnings ignored: a program without the run API must not die of
    USR1; the API installs its own handler over this."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)
    for sig in WARNINGS:
        signal.signal(sig, signal.SIG_IGN)


def block_signals() -> None:
    """Before starting the child: the signals wait for ``StopWatch.wait`` (no handler)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)


def _name(signum: int) -> str:
    return signal.Signals(signum).name.removeprefix("SIG")


@dataclass
class StopWatch:
    """Waits for the child, forwarding and timing the stop signals (see the module doc)."""

    child: subprocess.Popen[bytes]
    events: EventLog
    run_dir: Path
    grace_seconds: float
    started: float = field(default_factory=time.time)
    parent: int = field(default_factory=os.getppid)
    received: list[str] = field(default_factory=list)
    forwarded: list[str] = field(default_factory=list)
    stop_signal: int | None = None
    stop_at: float | None = None  # epoch seconds of the first stop signal
    deadline: float | None = None  # monotonic
    ignored: dict[str, Any] | None = None  # the stop_ignored record, once written

    def wait(self) -> int:
        """The child's wait status (negative: killed by that signal)."""
        while self.child.poll() is None:
            left = _IDLE_WAIT_S if self.deadline is None else self.deadline - time.monotonic()
            if left <= 0:
                return self._enforce()
            info = signal.sigtimedwait(_WATCHED, min(left, _IDLE_WAIT_S))
            if info is not None and info.si_signo != signal.SIGCHLD:
                self._on_signal(info.si_signo, info.si_pid)
        return self.child.returncode

    def _on_signal(self, signum: int, sender: int) -> None:
        self.received.append(_name(signum))
        if sender not in (self.parent, 0) and self.child.poll() is None:
            self.forwarded.append(_name(signum))
            self.child.send_signal(signum)
        budget_end = time.monotonic() + stop_budget(signum, self.grace_seconds)
        if self.stop_signal is None:
            self.stop_signal, self.stop_at, self.deadline = signum, time.time(), budget_end
            self.events.emit("stop_signal", signal=_name(signum), forwarded=sender not in (self.parent, 0),
                             deadline_s=round(stop_budget(signum, self.grace_seconds), 1), command=True)
        elif signum not in WARNINGS and self.stop_signal in WARNINGS:
            # SIGTERM after the warning (the time limit came): its shorter budget, if shorter.
            self.deadline = min(self.deadline or budget_end, budget_end)

    def _enforce(self) -> int:
        """The deadline passed with the program still running: end it, record it."""
        assert self.stop_signal is not None and self.stop_at is not None
        killed_with = "SIGKILL"
        if not any(s in ("TERM", "INT") for s in self.received):
            self.child.terminate()
            try:
                self.child.wait(KILL_AFTER_S)
                killed_with = "SIGTERM"
            except subprocess.TimeoutExpired:
                pass
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        ignored_s = round(time.time() - self.stop_at, 1)
        lost = work_lost(self.run_dir, int(self.events.base["rank"]), self.started)
        # The message names no rank: the post-mortem and the reports put "rank N (component) on node" first.
        message = (f"ignored the stop signal (SIG{_name(self.stop_signal)}) for {ignored_s:g} s; killed at the "
                   f"hard deadline ({killed_with}); work lost: {lost['work_lost']}")
        self.ignored = self.events.emit(
            "stop_ignored", signal=_name(self.stop_signal), delivered_at=self.stop_at, ignored_s=ignored_s,
            killed_with=killed_with, deadline_s=round(stop_budget(self.stop_signal, self.grace_seconds), 1),
            pid=self.child.pid, message=message, command=True, **lost)
        return self.child.returncode

    def exit_code(self, status: int) -> int:
        """The rank's exit code: the API's own after an enforced stop (85 after the
        warning, 143 after SIGTERM), else the program's (signal N: 128 + N)."""
        if self.ignored is not None and self.stop_signal is not None:
            return preempt.EXIT_REQUEUE if self.stop_signal in WARNINGS else preempt.EXIT_TERMINATED
        return status if status >= 0 else 128 - status


def work_lost(run_dir: Path, rank: int, since: float) -> dict[str, Any]:
    """What a program ended now loses, from its run API lines: the steps it logged
    (``run.log``) in this attempt after the newest checkpoint it saved (``run.save``,
    in any attempt: the point a restart restores). An async save's checkpoint line is
    written once its copy is taken, before the write ends; one still being written when
    the program is killed is not kept, so this is the least that is lost."""
    last_step: int | None = None
    resume_at: int | None = None  # the newest checkpoint's step + 1
    for e in read_events(run_dir):
        if e.get("rank") != rank:
            continue
        it = e.get("iteration")
        if type(it) is not int:
            continue
        if e.get("ev") == "action" and e.get("type") == "step" and float(e.get("time") or 0) >= since:
            last_step = it if last_step is None else max(last_step, it)
        elif e.get("ev") == "checkpoint" and e.get("ok") is not False:
            resume_at = it if resume_at is None else max(resume_at, it)
    if last_step is None:
        text = ("unknown: the program logs no steps through the run API"
                + ("" if resume_at is not None else "; no checkpoint"))
        return {"work_lost": text, "work_lost_steps": None, "last_step": None,
                "last_checkpoint_step": None if resume_at is None else resume_at - 1}
    if resume_at is None:
        lost = last_step + 1
        text = f"all {lost} steps: no checkpoint"
    else:
        lost = max(0, last_step + 1 - resume_at)
        text = f"{lost} steps since its last checkpoint (step {resume_at - 1})"
    return {"work_lost": text, "work_lost_steps": lost, "last_step": last_step,
            "last_checkpoint_step": None if resume_at is None else resume_at - 1}

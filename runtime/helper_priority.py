"""The memory tier's helper threads (the writer, the replica streams' sender and receiver) at a
lower CPU priority than the training thread, when asked: ``HETRUN_HELPER_NICE=N`` (1-19; 0 or
unset: unchanged).

Why: the PPO example keeps both cores of this machine busy, and each helper thread's wake-up
(a write due, a replica to send or arriving) took a core from a training thread at once (Linux
favours a thread that just woke): with the tier at one snapshot an iteration the whole iteration
ran ~11 % slower than with it off, several times the training thread's own share (1.6 %,
benchmarks/node_death.md, session 42). A niced helper runs in the cores' idle time first. The
cost: behind a node that is never idle its writes and replicas wait (the writer drops its oldest
queued write, the streams skip a replica: counted, and a restore takes a step every rank holds).

Linux only: ``setpriority`` on a thread id sets that thread's nice value alone.
"""

from __future__ import annotations

import contextlib
import os
import threading

ENV = "HETRUN_HELPER_NICE"


def helper_nice() -> int:
    """The nice value the helpers take (0: none), from ``HETRUN_HELPER_NICE``, clamped to 0-19."""
    try:
        return max(0, min(19, int(os.environ.get(ENV, "0") or 0)))
    except ValueError:
        return 0


def lower_this_thread() -> None:
    """Called first thing on a helper thread: its nice value raised to ``helper_nice()``."""
    nice = helper_nice()
    if nice:
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: unchanged
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)

"""Idle CPU on the cores this process may run on, between two reads: whether the memory tier's
helper threads (runtime/replica_sockets.py) took a core from training.

Why: the adaptive N (runtime/memory_tier.py) charges a snapshot its training-thread seconds and,
once, all of its helper threads' CPU too. That is right where the rank has no core to spare (one
core per task, bound: the threads run in the training thread's place), and twice the real cost
where it has (a GPU learner's node, a rank with cores its threads leave idle): the PPO learner's
snapshot took 0.85 ms of its training thread and 0.5 ms of the helpers', which ran on a core
nothing else used, so `auto` chose N = 2 for a cost (1.8 % at N = 1) within its 2 % budget, and a
node death lost up to 2 iterations instead of at most 1 (benchmarks/node_death.md, session 28).

What is measured: the idle time of the CPUs in this process's affinity mask, as CPU seconds
since the last read. Helper CPU up to that much ran beside
training, not in its place (the idle left over is what nobody wanted meanwhile). Not known
(``None``: count every helper second) off Linux, or under a cgroup CPU quota, where idle cores
need not be this process's to use.
"""

from __future__ import annotations

import os
from pathlib import Path

_STAT = "/proc/stat"
_UPTIME = "/proc/uptime"


def _quota_limited() -> bool:
    """A cgroup v2 CPU quota on this process (``cpu.max`` not "max"): idle CPUs are not its to use."""
    try:
        rel = next((line.split("::", 1)[1].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), None)
        if rel is None:
            return False
        limit = (Path("/sys/fs/cgroup") / rel.lstrip("/") / "cpu.max").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return limit != "max"


class IdleMeter:
    """``idle_s()``: CPU seconds the process's allowed cores stood idle since the last call.

    Read with ``pread`` on a file kept open (2 us for ``/proc/uptime``, 8 for ``/proc/stat``;
    opening it each time was 15-40 us, on the training thread at every snapshot): the node's
    total idle from ``/proc/uptime`` when the process may run on every CPU, else the allowed
    CPUs' idle and iowait from ``/proc/stat``."""

    def __init__(self) -> None:
        self._fd = -1
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            allowed = set()
        self._names = {f"cpu{c}" for c in allowed}
        self._whole = bool(allowed) and len(allowed) >= (os.cpu_count() or 0)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._size = 128 * (len(allowed) + 2) if not self._whole else 64
        if allowed and not _quota_limited():
            try:
                self._fd = os.open(_UPTIME if self._whole else _STAT, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self._fd = -1
        self._last = self._read()
        self.known = self._last is not None

    def _read(self) -> float | None:
        """Idle CPU seconds so far over the allowed CPUs; None when it cannot be read."""
        if self._fd < 0:
            return None
        try:
            text = os.pread(self._fd, self._size, 0).decode()
            if self._whole:
                return float(text.split()[1])  # /proc/uptime: seconds up, idle seconds summed over CPUs
            total = 0
            for line in text.splitlines()[1:]:
                if not line.startswith("cpu"):
                    break  # the per-CPU lines come first
                name, _, rest = line.partition(" ")
                if name in self._names:
                    fields = rest.split()
                    total += int(fields[3]) + int(fields[4])
            return total / self._tick
        except (OSError, ValueError, IndexError):
            return None

    def idle_s(self) -> float | None:
        """CPU seconds idle on the allowed cores since the last call (None: not known)."""
        if not self.known:
            return None
        now = self._read()
        if now is None:
            return None
        spent, self._last = now - (self._last or 0.0), now
        return max(0.0, spent)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


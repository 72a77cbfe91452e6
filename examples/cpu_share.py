"""Which of a node's cores a learner's update may use right now: the ones its rollout ranks leave idle.

In a pipelined PPO job the rollout ranks step their games for a few seconds
of every update and then wait for new weights; the learner is busy throughout.
On a node both share, the learner's update should run on every core the
rollouts are not using *at this moment*: all of them while the rollouts wait,
one fewer per rollout rank while they step (more torch threads than free
cores would slow the rollout, and the pipeline's period with it). The Atari
example spends that count as threads that each compute one fixed part of the
minibatch step (examples/atari_ppo.py: the same numbers however many ran).

Each rank on the node owns one file, ``<run_dir>/logs/cpu-phase/<node>/
<role>-<rank>`` (hetrun.rundir.RunPaths.cpu_phase; role ``learner`` or
``rollout``, whatever the job names its components), holding one byte:
``1`` while that rank computes, ``0`` while it waits. A rollout rank writes it
around its rollout; a learner reads the others' between its minibatch steps
(a directory listing and a few one-byte reads, microseconds beside a step of
hundreds of milliseconds). Files, not an MPI window, because no collective is
needed: a rank that never wrote one is simply not counted, and a stale ``1``
from a rank that died only makes the learner use fewer threads.

Ranks on other nodes never meet here: the directory is per node name.

Other work on the host is not in those files; where this process may run on
every CPU of the host, the kernel's count of runnable threads right now
(``/proc/loadavg``) caps the threads too. More torch threads than idle cores
is far worse than one thread: on this 2-core machine at load 14 an Atari
update took 46-49 s with 2 threads against 10-13 s with one (OpenMP threads
spinning at barriers for a thread that is not running; benchmarks/atari.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from hetrun.rundir import RunPaths

BUSY, IDLE = b"1", b"0"
ROLES = ("learner", "rollout")


def node_cpus() -> int:
    """CPUs this process may run on (its affinity mask: what Slurm's cgroup or binding, or the
    local launcher, gives it; hetrun's local mpirun runs ranks unbound, so: the host's)."""
    return max(1, len(os.sched_getaffinity(0)))


def threads_for_update(cpus: int, busy_rollouts: int, learners: int, runnable_elsewhere: int | None = None) -> int:
    """torch threads for one learner's next step: the cores no busy rollout rank holds, shared
    evenly by the node's learners, and no more than the cores nothing else is running on
    (``runnable_elsewhere``: threads of other processes runnable now; None: unknown); at least one."""
    share = (cpus - busy_rollouts) // max(1, learners)
    if runnable_elsewhere is not None:
        share = min(share, cpus - runnable_elsewhere)
    return max(1, share)


def runnable_elsewhere(own_threads: int, cpus: int) -> int | None:
    """Threads of other processes runnable on the host right now: /proc/loadavg's running count
    less this process's ``own_threads``. None where it says nothing about our CPUs (a mask
    narrower than the host: the count is the host's) or cannot be read."""
    if cpus != os.cpu_count():
        return None
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0, running - own_threads)


class CpuPhase:
    """This rank's phase file, and what the other ranks on its node are doing."""

    def __init__(self, run_dir: str | os.PathLike[str], node: str, role: str, rank: int) -> None:
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        if not node or "/" in node or node in (".", ".."):
            raise ValueError(f"node name {node!r} cannot name a directory")
        self.dir: Path = RunPaths(run_dir).cpu_phase(node)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = f"{role}-{rank}"
        self._fd = os.open(self.dir / self.name, os.O_RDWR | os.O_CREAT, 0o644)
        self.mark(busy=True)

    def mark(self, *, busy: bool) -> None:
        os.pwrite(self._fd, BUSY if busy else IDLE, 0)

    def others(self) -> dict[str, bool]:
        """{file name: busy} of the node's other ranks."""
        out: dict[str, bool] = {}
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name == self.name:
                continue
            try:
                with open(entry.path, "rb") as f:
                    out[entry.name] = f.read(1) == BUSY
            except FileNotFoundError:  # removed between the listing and the read
                continue
        return out

    def update_threads(self, cpus: int, elsewhere: int | None = None) -> int:
        """``threads_for_update`` for this learner, from the other ranks' files right now
        (``elsewhere``: ``runnable_elsewhere``'s count, None: not known)."""
        others = self.others()
        busy_rollouts = sum(busy for name, busy in others.items() if not name.startswith("learner-"))
        learners = 1 + sum(name.startswith("learner-") for name in others)
        return threads_for_update(cpus, busy_rollouts, learners, elsewhere)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

"""The node heartbeat of spare-node jobs (docs/PREEMPTION.md, node failure): a bash loop
beside each node's lowest rank that rewrites ``logs/alive/<node>`` while the rank lives,
read by the batch script's monitor (slurm_plugin/render.py).

Its own module, importing nothing heavy (no torch), so that a command component's rank
wrapper (runtime/command_rank.py, on every rank's start-up path) starts the same beat as
the MPI executor (runtime/executor.py through runtime/recovery.py, which re-exports these).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from hetrun.errors import SpecError
from hetrun.rundir import HEARTBEAT_DEFAULT_S, HEARTBEAT_ENV, NODE_TIMEOUT_ENV, RunPaths


def heartbeat_s(env: Any = None) -> float:
    """Seconds between two heartbeats: ``$HETRUN_HEARTBEAT_S`` (docs/PREEMPTION.md), else the default."""
    env = os.environ if env is None else env
    raw = env.get(HEARTBEAT_ENV)
    if raw in (None, ""):
        return HEARTBEAT_DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SpecError(f"${HEARTBEAT_ENV}={raw!r} is not a positive number of seconds",
                        key_path=f"env.{HEARTBEAT_ENV}", value=raw,
                        hint=f"set it to e.g. {HEARTBEAT_DEFAULT_S}, well below ${NODE_TIMEOUT_ENV}")
    return value


def restarts_in_allocation(plan: Any) -> bool:
    """Whether a node death restarts the job inside its allocation: a component holds spare
    nodes, or may go on packed onto fewer nodes (``min_nodes`` below its ``nodes``). Such a
    job's ranks beat (the batch script's monitor needs it to see a node die in seconds) and
    its memory tier is on by default."""
    if plan is None:
        return False
    for c in plan.raw.get("components") or []:
        fewest = c.get("min_nodes")
        if int(c.get("spare_nodes") or 0) or (fewest is not None and int(fewest) < int(c.get("nodes") or 1)):
            return True
    return False


# The beat itself: a bash loop beside the rank, not a thread in it. Measured
# (benchmarks/heartbeat_gaps.py, load average 25 on 2 cores): a Python thread's beat
# waits for the GIL, which a starved main thread holds while it is off the CPU, and
# stopped for up to 5.7 s in a healthy rank; a sleeper process is woken on time. It
# ignores the stop signals (a preempted rank checkpoints for up to grace_seconds and
# must not look dead meanwhile) and ends within one period of its rank: SIGKILLed
# with the node, or ``kill -0`` finds the rank gone. It writes the file itself (bash's
# printf, one write of a whole line), in place: no child process. A rename by `mv`
# outlived the SIGKILL that stop_heartbeat sends bash and put the file back after its
# unlink (seen at load 25: a stale counter after a healthy end, which the monitor takes
# for a dead node). Opened read-write (`1<>`), never truncated: the counter only grows,
# so each line covers the last. Truncated (`>`) each beat, a node killed between the
# truncation and the write left an empty file, which the monitor's `read` skipped for ever:
# a death seen only 122.8 s later, by a collective's timeout (session 29,
# benchmarks/node_death.md).
_BEAT = r"""
trap '' TERM INT HUP USR1 USR2
rank=$1 path=$2 period=$3 count=0
while kill -0 "$rank" 2>/dev/null; do
    count=$((count + 1))
    printf '%s\n' "$count" 1<> "$path" 2>/dev/null
    sleep "$period"
done
"""


def start_heartbeat(run_dir: Any, node: str) -> subprocess.Popen[bytes]:
    """Rewrite ``logs/alive/<node>`` with a growing counter every ``heartbeat_s()`` for as
    long as this process lives (a bash loop beside it, see _BEAT): the batch script's
    monitor (slurm_plugin/render.py) takes a node whose counter has not changed for
    ``$HETRUN_NODE_TIMEOUT`` s for dead (a killed node, whose processes all died with it;
    Slurm itself notices only after SlurmdTimeout). The content, not the mtime: the monitor
    compares what it reads with what it read before, on its own clock (no skew), and
    opening the file revalidates an NFS client's attribute cache. One write of a whole
    line, in place (see _BEAT: a torn read is skipped, never taken for a change that
    did not happen); a slow write of the shared run directory only delays a beat."""
    path = RunPaths(str(run_dir)).heartbeats / node
    os.makedirs(path.parent, exist_ok=True)
    proc = subprocess.Popen(["bash", "-c", _BEAT, "hetrun-heartbeat", str(os.getpid()), str(path),
                             f"{heartbeat_s():g}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
    _BEATING.append((proc, path))
    return proc


_BEATING: list[tuple[subprocess.Popen[bytes], Path]] = []


def stop_heartbeat() -> None:
    """The rank ends normally (done, or an agreed stop): stop the beat and remove its node's
    heartbeat file, so the monitor does not take the exit for a death."""
    while _BEATING:
        proc, path = _BEATING.pop()
        proc.kill()  # SIGKILL: the loop ignores the stop signals
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)  # reaped: the loop writes no more (it starts no writer child)
        with contextlib.suppress(OSError):
            os.unlink(path)

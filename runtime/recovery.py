"""The executor's memory tier: when it is on, the snapshot it takes each N iterations,
and the restore that prefers a peer-memory snapshot to the shared store.

On (``checkpoint.memory_every`` N > 0; by default, when a component has
``spare_nodes``, adaptive: runtime/memory_tier.py), for the MPI executor only. ``restore`` is what the executor
calls instead of ``resume.restore_if_any``: every rank asks the memory tier
(runtime/memory_tier.py) for the newest step every rank holds a verified copy
of, and the store for its newest complete step; the newer wins (memory on a
tie: no shared-filesystem read). Memory's outcome is written as a
``memory_restore`` event on every rank (used or not, why not, each rank's
source node and kind, every copy that failed its checksum); a memory restore
writes the ``restore`` event itself with ``source: "memory"``, the store path
writes it as before (``resume.restore_if_any``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetrun.runtime import preempt, resume
from hetrun.runtime.memory_tier import MemorySnapshots

from hetrun.errors import SpecError
from hetrun.rundir import DEFAULTS, HEARTBEAT_DEFAULT_S, HEARTBEAT_ENV, NODE_TIMEOUT_ENV, RunPaths

ADAPTIVE = "auto"  # checkpoint.memory_every's spelling of the adaptive N (dag/spec.py)

# Snapshots each node keeps per rank: ranks of a pipelined job run up to a few
# iterations apart, and the restore needs a step every rank still holds.
KEEP = 8


def memory_every(plan: Any) -> int | None:
    """N of ``checkpoint.memory_every``: 0 off, None adaptive (MemorySnapshots picks N).
    ``auto``: adaptive. Unset: the default (hetrun.rundir.DEFAULTS: adaptive) when a component
    has spare_nodes, else off."""
    cfg = (getattr(plan, "checkpoint", None) or {}) if plan is not None else {}
    value = cfg.get("memory_every", DEFAULTS.memory_every)
    if value == ADAPTIVE:
        return None
    if value is None:
        return None if spares_in(plan) else 0
    return int(value)


def memory_replicas(plan: Any) -> int:
    cfg = (getattr(plan, "checkpoint", None) or {}) if plan is not None else {}
    value = cfg.get("memory_replicas")
    return DEFAULTS.memory_replicas if value is None else int(value)


def enabled(ctx: Any) -> bool:
    comm = getattr(ctx, "world_comm", None)
    return (comm is not None and getattr(ctx, "world_collective", None) is None
            and memory_every(getattr(ctx, "plan", None)) != 0)


def _store_newest(ctx: Any, slot: Any) -> int | None:
    """The newest store step every component can offer (the one the store path would try first)."""
    steps = slot.store.steps()
    mine = {"component": ctx.component, "required": resume._has_checkpoint_action(ctx, ctx.component),
            "steps": steps, "every": bool(steps) and resume._saves_every_component(slot.store)}
    everyone = resume._world_allgather(ctx, mine)
    return max(resume._candidate_steps(resume._required(everyone)), default=None)


def restore(ctx: Any, workload: Any, store_restore: Callable[[Any, Any], int]) -> tuple[int, MemorySnapshots]:
    """Collective. (the iteration to start at, this rank's memory tier)."""
    plan = ctx.plan
    t0 = time.perf_counter()
    world = ctx.world_comm
    # None: adaptive (the smallest power-of-two N costing <= 2%, agreed across the ranks).
    mem = MemorySnapshots(world, ctx.run_dir, node=ctx.node, every=memory_every(plan),
                          replicas=memory_replicas(plan), keep=KEEP,
                          root=_root(world.Get_size()))
    found = mem.restore()
    slot = resume._slot(ctx)
    newest = _store_newest(ctx, slot)
    use = found.step is not None and (newest is None or found.step >= newest)
    log = resume._events(ctx)
    why = ("" if use else found.reason or f"the store's step {newest} is newer than memory's {found.step}")
    log.emit("memory_restore", used=use, step=found.step, store_step=newest, reason=why or None,
             source=found.source or None, sources=found.sources, rejected=found.rejected,
             seconds=round(found.seconds, 4), every=mem.every, partners=mem.partners)
    if not use:
        log.close()
        return store_restore(ctx, workload), mem
    restarts = resume.restart_count()
    preempt.install(ctx)
    resume._arm_deadline_event(ctx)
    resume._check_preemption_budget(ctx, restarts)
    lost_before = resume._last_iteration_done(ctx)
    agreed = time.time()
    iteration, loaded = resume._load_chosen(ctx, slot, workload, found.step, found.tree)
    log.emit("restore", step=found.step, iteration=iteration, restart_count=restarts,
             max_restarts=resume.max_restarts(ctx), restored_state=True, source="memory",
             from_node=found.source.get("node"), from_kind=found.source.get("kind"),
             seconds=round(time.perf_counter() - t0, 4), agreed=agreed, loaded=loaded,
             cpu_s=round(time.process_time(), 3), skipped=[],
             work_lost=max(0, lost_before + 1 - iteration) if lost_before is not None else None)
    log.close()
    slot.writer.prepare(workload.state_dict())
    return iteration, mem


def _root(world_size: int) -> str:
    """The tier's root on this node; the world size in the path, so a resized run never
    takes another shape's snapshots for its own."""
    from hetrun.runtime.ckpt.memory import default_root

    return os.path.join(default_root(), f"w{world_size}")


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


def spares_in(plan: Any) -> bool:
    return plan is not None and any(int(c.get("spare_nodes") or 0) for c in (plan.raw.get("components") or []))


# The beat itself: a bash loop beside the rank, not a thread in it. Measured
# (benchmarks/heartbeat_gaps.py, load average 25 on 2 cores): a Python thread's beat
# waits for the GIL, which a starved main thread holds while it is off the CPU, and
# stopped for up to 5.7 s in a healthy rank; a sleeper process is woken on time. It
# ignores the stop signals (a preempted rank checkpoints for up to grace_seconds and
# must not look dead meanwhile) and ends within one period of its rank: SIGKILLed
# with the node, or ``kill -0`` finds the rank gone.
_BEAT = r"""
trap '' TERM INT HUP USR1 USR2
rank=$1 path=$2 period=$3 tmp=$4 count=0
while kill -0 "$rank" 2>/dev/null; do
    count=$((count + 1))
    printf '%s\n' "$count" > "$tmp" 2>/dev/null && mv -f "$tmp" "$path" 2>/dev/null
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
    opening the file revalidates an NFS client's attribute cache. Whole lines only (a
    rename), so the monitor never reads a half-written one; a slow write of the shared
    run directory only delays a beat."""
    path = RunPaths(str(run_dir)).heartbeats / node
    os.makedirs(path.parent, exist_ok=True)
    tmp = path.parent / f".{node}.tmp"  # a dot name: the monitor's `rm logs/alive/*` leaves it
    proc = subprocess.Popen(["bash", "-c", _BEAT, "hetrun-heartbeat", str(os.getpid()), str(path),
                             f"{heartbeat_s():g}", str(tmp)],
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
            proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(path)


def snapshot_tree(workload: Any, iteration: int, pipeline: Any) -> dict[str, Any]:
    """The tree an interval checkpoint at ``iteration`` would store (resume.save_checkpoint's)."""
    from hetrun.runtime.ckpt.state import capture_rng

    extra = {"pipeline": pipeline} if pipeline is not None else {}
    return {"workload": workload.state_dict(), "rng": capture_rng(), "iteration": iteration, **extra}

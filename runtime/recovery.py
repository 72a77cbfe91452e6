"""The executor's memory tier: when it is on, the snapshot it takes each N iterations,
and the restore that prefers a peer-memory snapshot to the shared store.

On (``checkpoint.memory_every`` N > 0; by default, when a component has
``spare_nodes``, adaptive: runtime/memory_tier.py), for the MPI executor and for a command
component's script through the run API (runtime/api/run.py, over its gloo transport:
runtime/memory_transport.py). ``restore`` is what they
call instead of ``resume.restore_if_any``: every rank asks the memory tier
(runtime/memory_tier.py) for the newest step every rank holds a verified copy
of, and the store for its newest complete step; the newer wins (memory on a
tie: no shared-filesystem read). Memory's outcome is written as a
``memory_restore`` event on every rank (used or not, why not, each rank's
source node and kind, every copy that failed its checksum); a memory restore
writes the ``restore`` event itself with ``source: "memory"``, the store path
writes it as before (``resume.restore_if_any``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from hetrun.runtime import preempt, resume
from hetrun.runtime.ckpt.state import capture_rng  # loaded by memory_tier's import anyway
from hetrun.runtime.heartbeat import (  # noqa: F401
    _BEAT,
    heartbeat_s,
    restarts_in_allocation,
    start_heartbeat,
    stop_heartbeat,
)
from hetrun.runtime.memory_tier import MemorySnapshots

from hetrun.rundir import DEFAULTS

ADAPTIVE = "auto"  # checkpoint.memory_every's spelling of the adaptive N (dag/spec.py)

# Snapshots each node keeps per rank: ranks of a pipelined job run up to a few
# iterations apart, and the restore needs a step every rank still holds.
KEEP = 8


def memory_every(plan: Any) -> int | None:
    """N of ``checkpoint.memory_every``: 0 off, None adaptive (MemorySnapshots picks N).
    ``auto``: adaptive. Unset: the default (hetrun.rundir.DEFAULTS: adaptive) when a node death
    restarts the job inside its allocation (a component with spare_nodes or min_nodes), else off."""
    cfg = (getattr(plan, "checkpoint", None) or {}) if plan is not None else {}
    value = cfg.get("memory_every", DEFAULTS.memory_every)
    if value == ADAPTIVE:
        return None
    if value is None:
        return None if restarts_in_allocation(plan) else 0
    return int(value)


def memory_every_max(plan: Any) -> int:
    """``checkpoint.memory_every_max``: the adaptive N's largest (a power of two, dag/spec.py)."""
    cfg = (getattr(plan, "checkpoint", None) or {}) if plan is not None else {}
    value = cfg.get("memory_every_max")
    return DEFAULTS.memory_every_max if value is None else int(value)


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


def snapshots(ctx: Any, comm: Any = None) -> MemorySnapshots:
    """Collective: this rank's memory tier over ``comm`` (default: the executor's MPI world).
    The run API passes its component's transport; its tier's path then names the component
    (a job's command components each have a world of their own)."""
    from hetrun.runtime.memory_transport import wrap

    plan = ctx.plan
    transport = wrap(ctx.world_comm if comm is None else comm)
    # None: adaptive (the smallest power-of-two N costing <= 2%, agreed across the ranks).
    return MemorySnapshots(transport, ctx.run_dir, node=ctx.node, every=memory_every(plan),
                           every_max=memory_every_max(plan), replicas=memory_replicas(plan), keep=KEEP,
                           root=_root(transport.size, None if comm is None else ctx.component))


def restore(ctx: Any, workload: Any, store_restore: Callable[[Any, Any], int],
            comm: Any = None) -> tuple[int, MemorySnapshots]:
    """Collective. (the iteration to start at, this rank's memory tier); ``comm``: ``snapshots``'."""
    t0 = time.perf_counter()
    mem = snapshots(ctx, comm)
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
    lost_before = resume._last_iteration_done(ctx, restarts)
    agreed = time.time()
    iteration, loaded = resume._load_chosen(ctx, slot, workload, found.step, found.tree)
    log.emit("restore", step=found.step, iteration=iteration, restart_count=restarts,
             max_restarts=resume.max_restarts(ctx), restored_state=True, source="memory",
             from_node=found.source.get("node"), from_kind=found.source.get("kind"),
             seconds=round(time.perf_counter() - t0, 4), agreed=agreed, loaded=loaded,
             cpu_s=round(time.process_time(), 3), skipped=[],
             work_lost=resume.work_lost(lost_before, iteration))
    log.close()
    slot.writer.prepare(workload.state_dict())
    return iteration, mem


def _root(world_size: int, component: str | None = None) -> str:
    """The tier's root on this node; the world size in the path, so a resized run never
    takes another shape's snapshots for its own (and a command component's name: its ranks
    are numbered within the component)."""
    from hetrun.runtime.ckpt.memory import default_root

    return os.path.join(default_root(), f"w{world_size}" + (f"-{component}" if component else ""))


def snapshot_tree(workload: Any, iteration: int, pipeline: Any) -> dict[str, Any]:
    """The tree an interval checkpoint at ``iteration`` would store (resume.save_checkpoint's)."""
    extra = {"pipeline": pipeline} if pipeline is not None else {}
    return {"workload": workload.state_dict(), "rng": capture_rng(), "iteration": iteration, **extra}


def take_snapshot(memory: MemorySnapshots, workload: Any, iteration: int, pipeline: Any) -> None:
    """``snapshot_tree`` into peer memory (the executor's and the run API's one way). The tree's
    capture, the state_dicts and the RNG states, is the tier's cost too: timed from before it
    (``started=``), so the adaptive N sees the whole snapshot (benchmarks/node_death.md, session 21)."""
    started = time.perf_counter()
    memory.snapshot(iteration, snapshot_tree(workload, iteration, pipeline), started=started)

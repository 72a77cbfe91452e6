"""Checkpoint and resume hooks of the executor (see ``hetrun.runtime.hooks``).

- ``restore_if_any(ctx, workload) -> int``: before the loop, on every rank.
  All ranks agree (a collective over the world) on the newest checkpoint step
  that EVERY component can load and verify (every component saves at every
  boundary). Only in a run directory written before that (no checkpoint says
  ``every_component``) the old rule holds: the components running
  ``checkpoint`` actions decide, the others restore their own state at that
  step when they have one and otherwise start fresh. Restores workload state,
  the executor's pipeline state (``restored_pipeline``) and the
  python/numpy/torch RNG states, and returns the iteration to start from
  (0 on a first run, which is normal). Writes a ``restore`` event with the
  restart count, the limit, the checkpoint used, ``restored_state`` (this
  rank loaded its own state) and ``fresh_reason`` when it did not, the ones
  skipped (and why) and the work lost.
- ``save_checkpoint(ctx, workload, iteration, pipeline=None) -> dict``:
  snapshot + background write into ``<checkpoint dir>/<component>/`` (one
  store per component, its ranks committing together over the component
  communicator). The stored tree: ``workload`` (its ``state_dict()``),
  ``rng`` (this process's global generators), ``iteration`` and, on a state
  producer's leader, ``pipeline`` (executor.Executor._pipeline_state).
- ``flush(ctx)``: wait for the write in flight (before exiting).

``checkpoint.optimizer_encoding: lossy-4bit`` (opt-in, LOSSY) stores the Adam
moments of the workload state as 4-bit codes (``hetrun.runtime.ckpt.lossy``);
the checkpoint meta then says ``"lossy": true``. Restore decodes them; weights,
step counters, RNG and the iteration are always exact.

The checkpoint directory is ``checkpoint.directory`` of the plan (relative to
the run directory), else ``<run_dir>/ckpt``. ``$HETRUN_CKPT_LOCAL`` adds a
node-local fast tier (e.g. ``/tmp/hetrun-ckpt``), drained to the shared one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrun.runtime import attempts, mpi_wait, preempt, resize
from hetrun.runtime.plan_view import CheckpointSection

from hetrun.errors import CheckpointError, RuntimeFailure
from hetrun.rundir import CKPT_LOCAL_ENV, RunPaths

if TYPE_CHECKING:
    from typing import TypeAlias

    from hetrun.runtime.api.run import ApiContext
    from hetrun.runtime.context import RankContext

    # An executor's rank or a script's (the public run API): the same calls serve both.
    Ctx: TypeAlias = RankContext | ApiContext

LOCAL_ENV = CKPT_LOCAL_ENV


@dataclass
class _Slot:
    writer: Any  # CheckpointWriter
    store: Any  # CheckpointStore
    coll: Any
    last_step: int | None = None
    # lossy-4bit: the moments are encoded off the training thread; this thread
    # encodes one snapshot and hands it to the writer (at most one at a time).
    encoder: threading.Thread | None = None
    encode_error: str | None = None
    encode_s: float = 0.0  # last lossy encode: part of what a final checkpoint costs
    pipeline: Any = None  # the executor's pipeline state of the restored checkpoint
    cold: Any = None  # object_rank.RankObjectTier: checkpoint.object_store's uploader and read tier


# One writer per (run directory, component, rank): a process that runs two jobs in turn
# (run_inprocess, tests) must never restore from, or write into, the other job's store.
_SLOTS: dict[tuple[str, str, int], _Slot] = {}


def _key(ctx: Ctx) -> tuple[str, str, int]:
    return (str(ctx.run_dir), ctx.component, ctx.comp_rank)


def restart_count() -> int:
    for key in ("SLURM_RESTART_COUNT", "HETRUN_RESTART_COUNT"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def max_restarts(ctx: Ctx) -> int | None:
    """The preemption budget (``preemption.max_preemptions``, or its old name
    ``max_restarts``; None = unlimited), reported in ``restore`` events."""
    from hetrun.dag.budgets import Budgets

    plan = getattr(ctx, "plan", None)
    return None if plan is None else Budgets.from_preemption(plan.preemption).max_preemptions


def checkpoint_settings(ctx: Ctx) -> CheckpointSection:
    """The job's ``checkpoint`` section (its defaults without a plan: a script hetrun did not submit)."""
    plan = getattr(ctx, "plan", None)
    return plan.checkpoint if plan is not None else CheckpointSection()


def checkpoint_dir(ctx: Ctx) -> Path:
    return RunPaths(ctx.run_dir).store(ctx.component, checkpoint_settings(ctx).directory)


def _local_dir(ctx: Ctx) -> Path | None:
    base = os.environ.get(LOCAL_ENV)
    if not base:
        return None
    return RunPaths(ctx.run_dir).local_store(base, ctx.component)


def _collective(comm: Any) -> Any:
    from hetrun.runtime.ckpt.collective import MPICollective, SoloCollective

    if comm is None or comm.Get_size() == 1:
        return SoloCollective()
    return MPICollective(comm)


def _slot(ctx: Ctx) -> _Slot:
    key = _key(ctx)
    slot = _SLOTS.get(key)
    if slot is None:
        from hetrun.runtime.ckpt import open_store, tiers_for
        from hetrun.runtime.ckpt.writer import CheckpointWriter

        cfg = checkpoint_settings(ctx)
        # A ctx may bring its own collective (the public run API over torch.distributed).
        coll = getattr(ctx, "collective", None) or _collective(getattr(ctx, "comm", None))
        tiers = tiers_for(checkpoint_dir(ctx), _local_dir(ctx))
        # checkpoint.object_store: a cold tier the committed steps are uploaded to in the
        # background (runtime/ckpt/object_rank.py), read last at restore.
        from hetrun.runtime.ckpt import object_rank

        keep = cfg.keep
        cold = object_rank.for_rank(cfg, ctx.component, tiers, rank=coll.rank, world_size=coll.size, keep=keep,
                                    emit=lambda ev: _emit_closed(ctx, ev))
        writer = CheckpointWriter(tiers, collective=coll, keep=keep,
                                  max_delta_chain=cfg.max_delta_chain,
                                  threads=max(1, min(4, os.cpu_count() or 1)),
                                  on_event=cold.on_commit if cold is not None else None)
        store = open_store(checkpoint_dir(ctx), _local_dir(ctx))
        if cold is not None:
            store.tiers.append(cold.tier)
        slot = _Slot(writer, store, coll, cold=cold)
        _SLOTS[key] = slot
        if len(_SLOTS) == 1:
            atexit.register(_close_all)
    return slot


def _join_encoder(slot: _Slot) -> None:
    """Wait until a lossy snapshot being encoded has been handed to the writer."""
    if slot.encoder is not None:
        slot.encoder.join()
        slot.encoder = None


def _close_all() -> None:
    for slot in _SLOTS.values():
        with contextlib.suppress(Exception):  # exiting; committed checkpoints stay valid
            _join_encoder(slot)
            slot.writer.close()
            if slot.cold is not None:
                slot.cold.close()
    _SLOTS.clear()


def _events(ctx: Ctx) -> Any:
    from hetrun.runtime.events import EventLog

    return EventLog(ctx.run_dir, rank=ctx.rank, component=ctx.component, node=getattr(ctx, "node", None))


def _emit_closed(ctx: Ctx, ev: dict[str, Any]) -> None:
    """One event from a background thread (the object tier's), its file closed again."""
    log = _events(ctx)
    fields = dict(ev)  # a copy: ``ev`` is the uploader's own record (ObjectUploader.results)
    try:
        log.emit(str(fields.pop("ev")), **fields)
    finally:
        log.close()


def _has_checkpoint_action(ctx: Ctx, component: str) -> bool:
    plan = getattr(ctx, "plan", None)
    if plan is None:
        return True
    return any(a.type == "checkpoint" and a.component == component for a in plan.actions)


def _saves_every_component(store: Any) -> bool:
    """Whether this store was written by a runtime that saves every component
    at every boundary (its checkpoints say so in their meta)."""
    try:
        return any(info.meta.get("every_component") for info in store.info())
    except CheckpointError:
        return False


def _required(everyone: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks whose component must hold the restored step."""
    with_steps = [e for e in everyone if e["steps"]]
    if any(e["every"] for e in with_steps):
        return everyone  # a component without that step would start inexact: not a candidate
    # A run directory from before: the components with `checkpoint` actions decide.
    return [e for e in with_steps if e["required"]] or with_steps


def restored_pipeline(ctx: Ctx) -> Any:
    """The executor's pipeline state of the checkpoint this rank restored (None: none)."""
    slot = _SLOTS.get(_key(ctx))
    return slot.pipeline if slot is not None else None


def _world_allgather(ctx: Ctx, value: Any) -> list[Any]:
    coll = getattr(ctx, "world_collective", None)  # the public run API's (torch or MPI)
    if coll is not None:
        return list(coll.allgather(value))
    comm = getattr(ctx, "world_comm", None)
    if comm is None or comm.Get_size() == 1:
        return [value]
    return mpi_wait.allgather(comm, value)


def _last_iteration_done(ctx: Ctx, restarts: int) -> int | None:
    """The newest iteration this rank started before the restart (events.jsonl).

    -1: the rank ran in an earlier attempt but started no action (an evaluator
    stopped before its first evaluation did no work, so it lost none). None:
    nothing to lose or nothing known (a rank new in this attempt, e.g. after a
    resize, or events that cannot be read)."""
    from hetrun.runtime.events import read_events

    best, ran = None, False
    try:
        for ev in read_events(ctx.run_dir, only=("action", "start")):
            if ev.get("rank") != ctx.rank:
                continue
            if ev.get("ev") == "action" and isinstance(ev.get("iteration"), int):
                best = ev["iteration"] if best is None else max(best, ev["iteration"])
            elif (ev.get("ev") == "start" and ev.get("component") == ctx.component
                  and isinstance(ev.get("restart_count"), int) and ev["restart_count"] < restarts):
                ran = True
    except OSError:
        return None
    return best if best is not None else (-1 if ran else None)


def work_lost(lost_before: int | None, iteration: int) -> int | None:
    """Iterations this rank started before the restart and must run again."""
    return None if lost_before is None else max(0, lost_before + 1 - iteration)


def restore_if_any(ctx: Ctx, workload: Any) -> int:
    """Restore the newest checkpoint every component can load into ``workload``;
    returns the iteration to start from (0: none). Collective over the world."""
    preempt.install(ctx)
    t0 = time.perf_counter()
    entered = time.time()
    restarts = restart_count()
    slot = _slot(ctx)
    _arm_deadline_event(ctx)
    _check_preemption_budget(ctx, restarts)
    steps = slot.store.steps()
    mine = {"component": ctx.component, "required": _has_checkpoint_action(ctx, ctx.component),
            "steps": steps, "every": bool(steps) and _saves_every_component(slot.store)}
    everyone = _world_allgather(ctx, mine)
    lost_before = _last_iteration_done(ctx, restarts)
    chosen, skipped = _agree_on_step(ctx, slot, workload, mine, everyone, restarts)
    log = _events(ctx)
    iteration = 0
    if chosen is None:
        _no_step(log, restarts, max_restarts(ctx), everyone, skipped, lost_before)
    else:
        step, value, agreed, resized = chosen
        iteration, loaded = _load_chosen(ctx, slot, workload, step, value)
        fresh = None if value is not None else (
            "component had no checkpoints (old run directory)" if not mine["steps"]
            else f"component had no checkpoint at step {step} (old run directory)")
        log.emit("restore", step=step, iteration=iteration, restart_count=restarts,
                 max_restarts=max_restarts(ctx), restored_state=value is not None,
                 **({"fresh_reason": fresh} if fresh else {}),
                 seconds=round(time.perf_counter() - t0, 4), entered=entered,
                 agreed=agreed, loaded=loaded,  # wall clock: the step agreed; the workload took its state
                 # CPU seconds this rank used since it started: with ranks sharing
                 # cores, it tells waiting (a core given away) from working.
                 cpu_s=round(time.process_time(), 3),
                 skipped=[{"step": s, "why": w} for s, w in skipped],
                 **({"resize": resized.to_json()} if resized is not None else {}),
                 work_lost=work_lost(lost_before, iteration))
    log.close()
    if slot.cold is not None:
        slot.cold.tier.close()  # the bucket tier's download cache: restored, no longer needed
    slot.writer.prepare(workload.state_dict())  # warm snapshot buffers in the background
    return iteration


def _arm_deadline_event(ctx: Ctx) -> None:
    preempt.set_hard_deadline_callback(
        lambda code, budget: _events(ctx).emit(
            "preempt", deadline=True, code=code, budget_s=budget,
            message="grace time over before the agreement/checkpoint finished; "
                    "the newest complete checkpoint stays the restore point"))


def _check_preemption_budget(ctx: Ctx, restarts: int) -> None:
    if max_restarts(ctx) is None:
        return
    over = attempts.preemption_budget_error(ctx.run_dir, restarts, getattr(ctx.plan, "preemption", None))
    if over:
        raise RuntimeFailure(f"component {ctx.component}: {over}",
                             hint="the checkpoints are kept; raise preemption.max_preemptions (null = unlimited) "
                                  "or resubmit to continue")


def _candidate_steps(required: list[dict[str, Any]]) -> set[int]:
    """The steps every required component holds (on every one of its ranks)."""
    candidates: set[int] | None = None
    for comp in {e["component"] for e in required}:
        steps = set.intersection(*(set(e["steps"]) for e in required if e["component"] == comp))
        candidates = steps if candidates is None else candidates & steps
    return candidates or set()


def _agree_on_step(ctx: Ctx, slot: _Slot, workload: Any, mine: dict[str, Any],
                   everyone: list[dict[str, Any]], restarts: int) -> tuple[Any, list[tuple[int, str]]]:
    """Newest candidate step first: every rank loads (or skips) it and all agree it
    verified. Returns ((step, loaded value or None, when agreed, the resize outcome)
    or None, skipped)."""
    required = _required(everyone)
    need = any(e["component"] == ctx.component for e in required)
    skipped: list[tuple[int, str]] = []
    resized = None
    live: dict[str, Any] | None = None  # the workload's state, taken once: restore decodes into it
    for step in sorted(_candidate_steps(required), reverse=True):
        value, problem = None, None
        if step in mine["steps"] or need:
            try:
                # Straight into the workload's own tensors where they fit: no
                # fresh 1x-state allocation and no copy in load_state_dict.
                live = live if live is not None else {"workload": workload.state_dict()}
                # Its own shard; a resized component's ranks follow runtime/resize.py's rule.
                value, resized = resize.load_for_rank(
                    slot.store, step, slot.coll.rank, slot.coll.size, workload=workload,
                    seed=int(getattr(ctx, "seed", 0)), restart_count=restarts, into=live)
            except CheckpointError as exc:
                if need:
                    problem = f"rank {ctx.rank} ({ctx.component}): {exc}"
        problems = [p for p in _world_allgather(ctx, problem) if p]
        if not problems:
            return (step, value, time.time(), resized), skipped
        skipped.append((step, "; ".join(problems)))
    if skipped:
        raise CheckpointError(
            "no checkpoint could be restored: " + " | ".join(f"step {s}: {w}" for s, w in skipped),
            hint="inspect with `hetrun ckpt verify RUN`")
    return None, skipped


def _no_step(log: Any, restarts: int, limit: int | None, everyone: list[dict[str, Any]],
             skipped: list[tuple[int, str]], lost_before: int | None) -> None:
    """No checkpoint to restore: a restarted run says so and what it loses."""
    if not restarts:
        return
    anyone = any(e["steps"] for e in everyone)
    log.emit("restore", step=None, iteration=0, restart_count=restarts, max_restarts=limit,
             restored_state=False,
             fresh_reason=("no step that every component saved" if anyone else "no checkpoint yet"),
             message="restarted, but no checkpoint yet: starting from the beginning",
             work_lost=work_lost(lost_before, 0))


def _load_chosen(ctx: Ctx, slot: _Slot, workload: Any, step: int,
                 value: Any) -> tuple[int, float | None]:
    """Put the agreed step's value into the workload and the RNGs; (iteration, when loaded).
    ``value`` None: this rank's component has no state at that step (old run directory)."""
    from hetrun.runtime.ckpt.lossy import decode_state
    from hetrun.runtime.ckpt.state import restore_rng

    if value is None:
        slot.last_step = step
        return step, None
    try:
        workload.load_state_dict(decode_state(value["workload"]))
        loaded = time.time()
        restore_rng(value["rng"])
        iteration = int(value["iteration"])
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint step {step} of {ctx.component} lacks workload/rng state ({exc})") from exc
    slot.pipeline = value.get("pipeline")
    slot.last_step = step
    return iteration, loaded


def save_checkpoint(ctx: Ctx, workload: Any, iteration: int, pipeline: Any = None) -> dict[str, Any]:
    """Snapshot now, write in the background; returns what the event should say.

    ``pipeline``: the executor's in-flight state (stored as ``pipeline``).
    """
    from hetrun.runtime.ckpt.state import capture_rng

    slot = _slot(ctx)
    _join_encoder(slot)  # the previous lossy save must reach the writer first
    info: dict[str, Any] = {"step": iteration}
    failed = slot.writer.take_error()
    if failed is not None:
        info["previous_error"] = failed.error  # training goes on; this save retries
    if slot.encode_error is not None:
        info["previous_error"], slot.encode_error = slot.encode_error, None
    if slot.last_step == iteration:
        done = slot.writer.wait()
        if done is None or (done.ok and done.step == iteration):
            info["skipped"] = "already saved at this iteration"
            return info
    meta = {"iteration": iteration, "component": ctx.component, "restart_count": restart_count(),
            "reason": preempt.stop_reason() or "interval", "every_component": True}
    extra = {"pipeline": pipeline} if pipeline is not None else {}
    encoding = optimizer_encoding(ctx)
    if encoding == "exact":
        state = {"workload": workload.state_dict(), "rng": capture_rng(), "iteration": iteration, **extra}
        info["stall_s"] = round(slot.writer.save(iteration, state, meta), 6)
    else:
        # Training waits only for a copy; 4-bit encoding (seconds for a large
        # state) and the writer's own snapshot run on the encoder thread.
        t0 = time.perf_counter()
        snapshot = _detached_copy(workload.state_dict())
        rng = capture_rng()
        slot.encoder = threading.Thread(
            target=_encode_and_save, args=(slot, iteration, snapshot, rng, meta, encoding,
                                           _detached_copy(extra)),
            name="ckpt-lossy-encode", daemon=True)
        slot.encoder.start()
        info["lossy"] = True
        info["stall_s"] = round(time.perf_counter() - t0, 6)
    slot.last_step = iteration
    plan = getattr(ctx, "plan", None)
    # A command component's steps are its own (the plan's training.iterations counts actions).
    if plan is not None and plan.component(ctx.component).runs_actions and iteration >= plan.iterations:
        # The run ends right after this: wait, since the interpreter's exit
        # stops the writer's thread pool before atexit handlers run.
        _join_encoder(slot)
        done = slot.writer.wait()
        info["ok"] = bool(done and done.ok) and slot.encode_error is None
        if slot.encode_error is not None:
            info["error"] = slot.encode_error
        elif done is not None and not done.ok:
            info["error"] = done.error
    return info


def _detached_copy(tree: Any) -> Any:
    """The state with every tensor cloned, so training may go on while it is encoded."""
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _detached_copy(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_detached_copy(v) for v in tree)
    return tree


def _encode_and_save(slot: _Slot, iteration: int, snapshot: Any, rng: Any,
                     meta: dict[str, Any], encoding: str, extra: dict[str, Any]) -> None:
    from hetrun.runtime.ckpt.lossy import encode_state, lossy_meta

    try:
        t0 = time.perf_counter()
        tree, encoded = encode_state(snapshot, encoding)
        slot.encode_s = time.perf_counter() - t0
        meta = {**meta, **lossy_meta(encoded), "encode_s": round(slot.encode_s, 4)}
        slot.writer.save(iteration, {"workload": tree, "rng": rng, "iteration": iteration, **extra}, meta)
    except BaseException as exc:  # reported by the next save / flush; training goes on
        slot.encode_error = f"lossy checkpoint encoding failed at iteration {iteration}: {exc!r}"


def optimizer_encoding(ctx: Ctx) -> str:
    """``checkpoint.optimizer_encoding`` of the plan (the default without a plan)."""
    return checkpoint_settings(ctx).optimizer_encoding


def flush(ctx: Ctx) -> dict[str, Any] | None:
    """Wait for this rank's checkpoint in flight; returns its outcome."""
    slot = _SLOTS.get(_key(ctx))
    if slot is None:
        return None
    _join_encoder(slot)
    if slot.encode_error is not None:
        error, slot.encode_error = slot.encode_error, None
        return {"step": slot.last_step, "ok": False, "error": error, "write_s": 0.0}
    res = slot.writer.wait()
    if res is None:
        return None
    if slot.cold is not None:
        # The last step's upload too (bounded), unless a stop signal is spending the grace
        # time: then it stays on the file tiers and the next checkpoint sends what is missing.
        slot.cold.flush(0.0 if preempt.stop_reason() else None)
    return {"step": res.step, "ok": res.ok, "error": res.error, "write_s": round(res.write_s, 4)}


def measured_checkpoint_cost() -> float:
    return max((s.writer.last_cost_s + s.encode_s for s in _SLOTS.values()), default=0.0)


def reset() -> None:
    """Close every writer and forget them (tests; a process running several jobs)."""
    _close_all()
    preempt.uninstall()

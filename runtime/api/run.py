"""``Run``: checkpoints, exact resume, the agreed stop and events for any script.

One implementation, and the action executor is a client of it
(runtime/hooks.py): ``restore``/``flush`` are ``hetrun.runtime.resume``'s
(same store, writer, restore selection, RNG capture, restore/work-lost
events), ``save`` is ``save_state`` below for both, the stop signal handling
is ``hetrun.runtime.preempt``'s and the agreement ``hetrun.runtime.api.stop``'s.
This module only adapts a user's
dict of objects to the workload protocol resume.py expects and connects the
ranks through whatever the script has (``hetrun.runtime.api.collectives``).

Steps: ``save(step, ...)`` records that steps ``0..step`` are done; the
checkpoint is stored under ``step + 1``, the step a resumed run starts from,
which is what ``restore`` returns (0 on a first run), as the executor's
iteration numbers do.

The memory tier (a job with ``spare_nodes`` or ``checkpoint.memory_every``):
``snapshot(step, ...)``, called after every step, keeps the state every N steps
(adaptive, <= 2 % of the step time) in this node's memory and a partner's on
another node, and ``restore`` after an in-allocation restart takes the newest
step every rank holds there, verified, over the store's when newer. Both are the
executor's (``hetrun.runtime.recovery``, ``hetrun.runtime.memory_tier``), over a
gloo group of their own (``hetrun.runtime.memory_transport``); the events they
write (``memory_restore``, ``restore`` with ``source: "memory"``,
``memory_tier``) are the action path's.
"""

from __future__ import annotations

import atexit
import operator
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hetrun.runtime import preempt, resume
from hetrun.runtime.api import env as envmod
from hetrun.runtime.api.stop import SoloAgreement, StepAgreement
from hetrun.runtime.events import EventLog
from hetrun.runtime.plan_view import PLAN_FILE, PlanView, load_plan

from hetrun.errors import CheckpointError, RuntimeFailure
from hetrun.rundir import WARM_FORKED_ENV, runs_at

if TYPE_CHECKING:
    from hetrun.runtime.context import RankContext

DEFAULT_WINDOW = 2
CKPT_EVERY_ENV = "HETRUN_CKPT_EVERY"


@dataclass
class ApiContext:
    """What resume.py / preempt.py read from a rank context (duck-typed RankContext)."""

    rank: int
    world_size: int
    component: str
    run_dir: Path
    node: str
    comp_rank: int = 0
    comp_size: int = 1
    plan: PlanView | None = None  # the job's plan when hetrun runs this script as a command component
    comm: Any = None
    world_comm: Any = None
    collective: Any = None  # the store's (checkpoint commits, from the writer thread)
    world_collective: Any = None  # the restore agreement's
    extra: dict[str, Any] = field(default_factory=dict)


class StateObjects:
    """A dict of tensors / Stateful objects as one workload (state_dict/load_state_dict)."""

    def __init__(self, objs: dict[str, Any]) -> None:
        import torch

        if not isinstance(objs, dict) or not objs:
            raise CheckpointError(f"expected a non-empty dict of name -> object, got {type(objs).__name__}",
                                  hint='e.g. {"model": model, "optim": optimizer}')
        for key, obj in objs.items():
            if not isinstance(key, str):
                raise CheckpointError(f"key {key!r}: names must be strings")
            stateful = callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
            if not (stateful or isinstance(obj, torch.Tensor)):
                raise CheckpointError(
                    f"key {key!r}: a {type(obj).__name__} has no state_dict()/load_state_dict()",
                    hint="pass tensors or objects with both methods (torch's Stateful protocol); "
                         "wrap anything else in a small class that has them")
        self.objs = objs

    def state_dict(self) -> dict[str, Any]:
        import torch

        return {k: (v if isinstance(v, torch.Tensor) else v.state_dict()) for k, v in self.objs.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        missing = sorted(set(self.objs) - set(state))
        if missing:
            raise CheckpointError(f"the checkpoint has no {missing} (it holds {sorted(state)})",
                                  hint="restore the same names that were saved")
        for key, obj in self.objs.items():
            if isinstance(obj, torch.Tensor):
                if state[key].data_ptr() != obj.data_ptr():  # decoded elsewhere (shape changed)
                    with torch.no_grad():
                        obj.copy_(state[key])
            else:
                obj.load_state_dict(state[key])


class Run:
    """A script's handle on hetrun; see ``hetrun.attach``."""

    def __init__(self, rank_env: envmod.RankEnv, run_dir: Path, component: str,
                 checkpoint_every: int, window: int, plan: PlanView | None = None) -> None:
        self.env = rank_env
        self.run_dir = run_dir
        self.component = component
        self.checkpoint_every = checkpoint_every
        self.window = window
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        # The job file's checkpoint / preemption sections (a hetrun command component):
        # resume.py and preempt.py read them from ctx.plan, as for an action component.
        self.ctx = ApiContext(rank_env.rank, rank_env.world_size, component, run_dir, node,
                              comp_rank=rank_env.rank, comp_size=rank_env.world_size, plan=plan)
        self.events = EventLog(run_dir, rank=envmod.event_rank(rank_env), component=component, node=node)
        self.start_step = 0
        self._connected = False
        self._agreement: Any = None
        self._last_log = time.time()
        self._closed = False
        # For the checkpoint a completed run writes at close(): the live objects the script
        # restores into / saves (trained in place), the newest step every rank agreed on
        # (should_stop / save are collective), and the step the newest save was after.
        self._objs: dict[str, Any] | None = None
        self._last_step: int | None = None
        self._saved_step: int | None = None
        self._memory: Any = None  # hetrun.runtime.memory_tier.MemorySnapshots when the tier is on
        self._state_kept: tuple[Any, ...] | None = None  # snapshot()'s last (objs, keys, values, StateObjects)
        self._take_snapshot: Any = None  # hetrun.runtime.recovery.take_snapshot, once the tier is on
        self._memory_enabled: bool | None = None  # _memory_on()'s answer, once asked
        atexit.register(self._unclosed)
        preempt.install(self.ctx)  # now: USR1's default action would kill the process
        self.events.emit("start", job_id=rank_env.job_id, restart_count=resume.restart_count(),
                         size=rank_env.world_size, comp_rank=rank_env.rank, comp_size=rank_env.world_size,
                         launcher=rank_env.launcher, pid=os.getpid(), api=True,
                         warm_start=WARM_FORKED_ENV in os.environ)  # forked from a warm server (runtime/warm_command.py)

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    # -- connecting the ranks -------------------------------------------------
    def _connect(self) -> None:
        """Collective on first use: the groups the store and the agreement need."""
        if self._connected:
            return
        from hetrun.runtime.api import collectives

        if self.env.world_size > 1:
            transport, store_coll, main_coll = self._transports(collectives)
            dirs = main_coll.allgather(str(self.run_dir))
            if len(set(dirs)) != 1:
                raise RuntimeFailure(f"the ranks resolved different run directories: {sorted(set(dirs))}",
                                     hint="set HETRUN_RUN_DIR (or attach(run_dir=...)) to one shared path")
            self.ctx.collective, self.ctx.world_collective = store_coll, main_coll
            self._transport = transport
        self._connected = True

    def _transports(self, collectives: Any) -> tuple[Any, Any, Any]:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            if dist.get_world_size() != self.env.world_size:
                raise RuntimeFailure(
                    f"torch.distributed has {dist.get_world_size()} ranks, the launcher "
                    f"({self.env.launcher}) says {self.env.world_size}",
                    hint="initialise the default process group over every rank of the job")
            store_group, main_group = collectives.new_cpu_group(), collectives.new_cpu_group()
            return (collectives.TorchMaxReduce(main_group), collectives.TorchCollective(store_group),
                    collectives.TorchCollective(main_group))
        if self.env.launcher == "mpirun" or "PMIX_RANK" in os.environ:
            from hetrun.runtime.ckpt.collective import MPICollective
            from mpi4py import MPI

            world = MPI.COMM_WORLD
            if world.Get_size() == self.env.world_size:
                return collectives.MPIMaxReduce(world), MPICollective(world), MPICollective(world)
        raise RuntimeFailure(
            f"rank {self.rank} of {self.world_size}: the ranks are not connected yet",
            hint="call torch.distributed.init_process_group() before run.restore()/save()/should_stop() "
                 "(or launch with MPI: srun --mpi=pmix / mpirun)")

    # -- checkpoints ------------------------------------------------------------
    def restore(self, objs: dict[str, Any]) -> int:
        """Load the newest checkpoint every rank can verify into ``objs`` (in place),
        restore the RNG states; returns the step to start from (0: none)."""
        self._connect()
        self._objs = objs
        if self._memory_on():
            from hetrun.runtime import recovery

            # The newest step every rank holds in peer memory (verified), else the store.
            self.start_step, self._memory = recovery.restore(self.ctx, StateObjects(objs), resume.restore_if_any,
                                                             comm=self._memory_transport())
        else:
            self.start_step = resume.restore_if_any(self.ctx, StateObjects(objs))
        self._agreement = None  # numbered from the restored step
        return self.start_step

    def snapshot(self, step: int, objs: dict[str, Any]) -> bool:
        """Keep the state after ``step`` in memory: this node's and a partner rank's on another
        node, every N steps (``checkpoint.memory_every``; adaptive by default: the smallest N
        costing <= 2 % of the step time, at most ``checkpoint.memory_every_max``, default 1). Call it after every step, on every rank (collective
        at the steps it keeps). A no-op (False) when the job has no memory tier: no
        ``spare_nodes`` nor ``memory_every``, one rank, or a script hetrun did not submit.
        Returns whether a snapshot was taken."""
        self._objs = objs
        self._last_step = step if self._last_step is None else max(self._last_step, step)
        if not self._memory_on():
            return False
        if self._memory is None:  # the script never called restore(): the tier starts here
            from hetrun.runtime import recovery

            self._connect()
            self._memory = recovery.snapshots(self.ctx, self._memory_transport())
        at = step + 1  # the step a restart resumes at, as save() numbers it
        if not self._memory.due(at):
            return False
        take = self._take_snapshot
        if take is None:  # imported once (an import statement per step cost ~5-40 us)
            from hetrun.runtime.recovery import take_snapshot as take

            self._take_snapshot = take
        take(self._memory, self._state_of(objs), at, None)
        return True

    def _state_of(self, objs: dict[str, Any]) -> StateObjects:
        """``StateObjects(objs)``, validated once while the script passes the same dict holding the
        same objects (every step, after the step's sleep in the DDP example: its checks and this
        method's import cost ~0.05 ms there, off the tier's own count; benchmarks/node_death.md)."""
        if type(objs) is not dict:
            return StateObjects(objs)  # (its error names what was passed)
        values = tuple(objs.values())
        kept = self._state_kept
        # (equal keys: as many values, each compared by identity)
        if kept is not None and kept[0] is objs and kept[1] == tuple(objs) and all(map(operator.is_, kept[2], values)):
            return kept[3]
        wrapped = StateObjects(objs)
        self._state_kept = (objs, tuple(objs), values, wrapped)
        return wrapped

    def _memory_on(self) -> bool:
        """The job's memory tier (``hetrun.runtime.recovery.memory_every``): a hetrun job, >1 rank.
        Asked at every step (``snapshot``): decided once, the plan and the ranks do not change."""
        if self._memory_enabled is None:
            if self.world_size <= 1 or self.ctx.plan is None:
                self._memory_enabled = False
            else:
                from hetrun.runtime import recovery

                self._memory_enabled = recovery.memory_every(self.ctx.plan) != 0
        return self._memory_enabled

    def _memory_transport(self) -> Any:
        """The tier's transport: a gloo one of its own over torch.distributed, else MPI's world
        (``_connect`` accepted one of the two)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from hetrun.runtime.memory_transport import GlooTransport

            return GlooTransport()
        from mpi4py import MPI

        return MPI.COMM_WORLD

    def save(self, step: int, objs: dict[str, Any], *, wait: bool = False) -> dict[str, Any]:
        """Checkpoint the state after ``step`` (collective: every rank, same step).
        Training waits only for a copy unless ``wait``; returns the outcome."""
        self._connect()
        self._objs, self._saved_step = objs, step
        self._last_step = step if self._last_step is None else max(self._last_step, step)
        return save_state(self.ctx, self.events, StateObjects(objs), step + 1, wait=wait)

    def checkpoint_due(self, step: int) -> bool:
        """Whether to checkpoint after ``step``: every ``checkpoint_every`` steps
        (the job file's ``checkpoint.interval`` under hetrun), the planner's rule."""
        return runs_at(self.checkpoint_every, step)

    # -- the agreed stop ----------------------------------------------------------
    def should_stop(self, step: int) -> bool:
        """After ``step`` on every rank: True on every rank at the same step once a
        stop was requested (signal, time limit) on any of them."""
        if self._agreement is None:
            self._connect()
            self._agreement = (SoloAgreement() if self.world_size == 1
                               else StepAgreement(self._transport, self.window, self.start_step))
        self._last_step = step if self._last_step is None else max(self._last_step, step)
        stop = self._agreement.check(step, preempt.stop_level(self.ctx))
        if stop:
            preempt.agree(self._agreement.level)
        return stop

    def checkpoints(self, component: str, *, rank: int = 0) -> Any:
        """Another component's committed checkpoints in this run (a ``CheckpointReader``):
        ``follow()`` yields each new step as it lands, ``load(step, objs)`` decodes it."""
        from hetrun.runtime.api.reader import CheckpointReader

        return CheckpointReader(self.ctx.run_dir, component, rank=rank)

    def log(self, step: int, **metrics: Any) -> None:
        """One ``action`` event of type ``step`` (``hetrun report`` counts it; a
        restart's work-lost accounting reads it)."""
        now = time.time()
        self.events.emit("action", type="step", id="step", iteration=step, start=self._last_log, end=now,
                         **({"metrics": metrics} if metrics else {}))
        self._last_log = now

    # -- ending -------------------------------------------------------------------
    def exit_for_requeue(self) -> NoReturn:
        """Wait for the checkpoint in flight and exit so the job comes back.

        After the warning signal or a near time limit: exit 85 (a batch script
        or ``RequeueExit=85`` turns it into a requeue) and, on rank 0 when
        ``scontrol`` is there, ``scontrol requeue`` the job now. After SIGTERM
        (Slurm preempting or cancelling) exit 143: Slurm requeues by its own
        policy, a cancel stays cancelled."""
        flushed = resume.flush(self.ctx)  # the checkpoint in flight, before saying it is saved
        code = preempt.exit_code(self.ctx)
        saved = self._saved_step is not None and not (isinstance(flushed, dict) and flushed.get("ok") is False)
        preempt.say_clean_stop(self.component, self.rank, code,
                               None if self._saved_step is None else self._saved_step + 1, saved=saved)
        requeued = None
        if code == preempt.EXIT_REQUEUE and self.rank == 0 and self.env.job_id:
            requeued = _scontrol_requeue(self.env.job_id)
        self.close(code, requeued=requeued)
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(code)

    def close(self, code: int = 0, **fields: Any) -> None:
        """Write the final checkpoint of a run that completed; wait for the checkpoint in
        flight; write the ``exit`` event. Collective."""
        completed = code == 0 and preempt.stop_reason() is None
        self._final_checkpoint(wanted=completed)
        flushed = resume.flush(self.ctx)
        if isinstance(flushed, dict) and flushed.get("ok") is False:
            self.events.emit("warning", message=f"last checkpoint write failed: {flushed.get('error')}")
        if self._memory is not None:
            # Collective: every replica in flight delivered; a completed run frees the node's memory.
            self._memory.close(remove=completed)
            self.events.emit("memory_tier", **self._memory.summary())
            self._memory = None
        if self._agreement is not None:
            self._agreement.close()
            self._agreement = None
        self.events.emit("exit", code=code, reason=preempt.stop_reason(), **fields)
        self._closed = True

    def _final_checkpoint(self, *, wanted: bool) -> None:
        """A run that completes checkpoints its last step (checkpoints on: an interval, or the
        script saved before; that step not saved yet),
        so extending it (``hetrun resubmit --set``) continues from there, none redone. The
        objects are the ones the script restored into or saved (trained in place); every rank
        must have reached the same step (one allgather), else nothing is saved and a warning
        says why. ``wanted`` (the run completed: exit 0, no stop) travels in the allgather, so
        a rank that closes after a late signal or with an error still joins it and the others
        do not wait for it forever."""
        checkpoints = self.checkpoint_every > 0 or self._saved_step is not None  # the job's or the script's
        if not checkpoints or self._objs is None or self._last_step is None:
            return
        last, saved = self._last_step, self._saved_step
        if self.world_size > 1:
            self._connect()
            votes = self.ctx.world_collective.allgather([wanted, last, saved])
            if not all(vote[0] for vote in votes):
                return  # some rank stopped or failed: the run did not complete
            seen = {(vote[1], vote[2]) for vote in votes}
            if len(seen) != 1:
                self.events.emit("warning", message="no final checkpoint: the ranks ended at different "
                                 f"steps {sorted({pair[0] for pair in seen})}")
                return
        if not wanted or last == saved:
            return  # stopped or failed (one rank), or the script saved its last step itself
        save_state(self.ctx, self.events, StateObjects(self._objs), last + 1, wait=True, reason="final")
        self._saved_step = last

    def _unclosed(self) -> None:
        # At interpreter exit the writer's threads are already stopped: say so, loudly.
        if not self._closed:
            self.events.emit("warning", message="the script ended without run.close(): a checkpoint "
                             "still being written may be lost; call run.close() before exiting")


def save_state(ctx: ApiContext | RankContext, events: EventLog, state: Any, resume_at: int, *, wait: bool = False,
               reason: str | None = None, pipeline: Any = None) -> dict[str, Any]:
    """Checkpoint ``state`` (an object with ``state_dict()``) as the point a resumed
    run starts from (``resume_at``) and write the ``checkpoint`` event.

    The one save path of ``Run.save`` and of both executors (``pipeline``: the
    executor's in-flight state messages). Training waits only for a copy
    unless ``wait``. The event carries the outcome both flat and as ``info``
    (what the reports read).
    """
    t0 = time.time()
    info = resume.save_checkpoint(ctx, state, resume_at, pipeline=pipeline)
    if wait:
        done = resume.flush(ctx) or {}
        info.update({k: done[k] for k in ("ok", "error", "write_s") if k in done})
    events.emit("checkpoint", iteration=resume_at, reason=reason or preempt.stop_reason() or "interval",
                start=t0, end=time.time(), info=dict(info), **info)
    return info


def _scontrol_requeue(job_id: str) -> bool | str:
    """True when Slurm accepted the requeue; the error text otherwise (the exit code still asks)."""
    exe = shutil.which("scontrol")
    if exe is None:
        return "scontrol not found on this node"
    try:
        r = subprocess.run([exe, "requeue", job_id], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"scontrol requeue failed: {exc}"
    return True if r.returncode == 0 else (r.stderr.strip() or f"scontrol exited {r.returncode}")


def attach(run_dir: str | os.PathLike[str] | None = None, *, name: str | None = None,
           component: str | None = None, checkpoint_every: int | None = None,
           window: int = DEFAULT_WINDOW) -> Run:
    """The run this process belongs to (see ``hetrun.attach``)."""
    from hetrun.runtime.api import rundir

    rank_env = envmod.discover()
    envmod.export_torchrun_env(rank_env)
    path = rundir.resolve(rank_env, run_dir, name)
    component = component or envmod.component_name()
    plan = job_plan(path, component)
    if checkpoint_every is None:
        checkpoint_every = _checkpoint_every(plan)
    return Run(rank_env, path, component, int(checkpoint_every), window, plan)


def job_plan(run_dir: Path, component: str) -> PlanView | None:
    """The plan of the hetrun job this rank is a command component of (its run
    directory holds plan.json naming the component); None for a script hetrun
    did not submit."""
    if not (run_dir / PLAN_FILE).is_file():
        return None
    plan = load_plan(run_dir, validate=False)  # validated at submit; a rank only reads it
    return plan if any(c.name == component for c in plan.components) else None


def _checkpoint_every(plan: PlanView | None) -> int:
    """``checkpoint.interval`` of the job file (its default: ``hetrun.rundir.DEFAULTS``).
    A script hetrun did not submit has no job file: ``$HETRUN_CKPT_EVERY``, else 0 (it
    checkpoints when it calls ``run.save``; no interval it did not ask for)."""
    if plan is not None:
        return plan.checkpoint.interval
    raw = os.environ.get(CKPT_EVERY_ENV, "0")
    if not raw.isdigit():
        raise RuntimeFailure(f"${CKPT_EVERY_ENV}={raw!r} is not a number of steps",
                             hint="e.g. HETRUN_CKPT_EVERY=100, or attach(checkpoint_every=100)")
    return int(raw)

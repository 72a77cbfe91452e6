"""In-process mode: every component's actions of a plan in one process.

Same plan, same workload code, same events as the MPI executor, but one
workload instance per component (each component has one "rank") and no MPI
world: for fast tests and for a laptop without MPI. Actions run in the plan's
topological order, iteration after iteration. Which weights a consumer loads
follows the same exact-version rule as the MPI executor
(runtime/state_history.py: the state sent at
``producer.last_run_at_or_before(i - lag)``), so a run here computes what the
pipelined MPI run computes. Checkpoints, as there: every component at every
boundary, the producer's sent states in its ``pipeline``.

    from hetrun.runtime.inprocess import run_inprocess
    result = run_inprocess("runs/ppo-...")          # a run dir with plan.json
    result = run_inprocess(plan_dict, run_dir=tmp)  # or a plan as a dict
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrun.errors import HetrunError, RuntimeFailure
from hetrun.rundir import PLAN_JSON

from .api.run import save_state
from .context import RankContext
from .dispatch import (
    IterState,
    checkpoint_boundary,
    micro_batches_of,
    run_dispatch,
    saves_at_end,
    sends_state_across,
)
from .events import EventLog
from .executor import effective_lag
from .hooks import Hooks, load_hooks
from .plan_view import ActionSpec, PlanView, load_plan, plan_from_dict
from .state_history import StateHistory, pick_for
from .workload import load_workload_class


@dataclass
class InProcessResult:
    exit_code: int
    workloads: dict[str, Any]  # component name -> workload instance
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per optimize/eval action
    iterations_done: int = 0
    wall_s: float = 0.0
    env_steps: int = 0


def _self_comm() -> Any:
    try:
        from mpi4py import MPI
    except ImportError:  # no MPI library on this machine: in-process needs none
        return None
    return MPI.COMM_SELF


def run_inprocess(
    plan_or_run_dir: str | os.PathLike[str] | dict[str, Any] | PlanView,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    iterations: int | None = None,
    hooks: Hooks | None = None,
    extra_search_dirs: list[Path] | None = None,
) -> InProcessResult:
    """Run a whole plan in this process; events go to ``<run_dir>/events.jsonl``."""
    if isinstance(plan_or_run_dir, PlanView):
        plan = plan_or_run_dir
    elif isinstance(plan_or_run_dir, dict):
        plan = plan_from_dict(plan_or_run_dir, Path(run_dir or ".") / PLAN_JSON)
    else:
        run_dir = run_dir or plan_or_run_dir
        plan = load_plan(plan_or_run_dir)
    if run_dir is None:
        raise RuntimeFailure("run_inprocess needs a run_dir for events.jsonl when given a plan object")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return _InProcess(plan, run_dir, hooks or load_hooks(), extra_search_dirs or []).run(
        iterations if iterations is not None else plan.iterations)


class _InProcess:
    def __init__(self, plan: PlanView, run_dir: Path, hooks: Hooks, search: list[Path]) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.hooks = hooks
        self.search = [run_dir, *search]
        for key in ("job_dir", "job_file"):
            if plan.raw.get(key):
                p = Path(plan.raw[key])
                self.search.append(p if key == "job_dir" else p.parent)
        self.node = socket.gethostname()
        self.by_id = {a.id: a for a in plan.actions}
        self.logs: dict[str, EventLog] = {}
        self.ctxs: dict[str, RankContext] = {}
        self.workloads: dict[str, Any] = {}
        comm = _self_comm()
        names = [c.name for c in plan.components]
        for c in plan.components:
            self.ctxs[c.name] = RankContext(
                rank=c.index, world_size=len(names), component=c.name, comp_rank=0, comp_size=1,
                group=None, comm=comm, device="cpu", seed=plan.seed, run_dir=run_dir,
                node=self.node, comp_ranks={n: [i] for i, n in enumerate(names)}, plan=plan,
                mode="inprocess", comms=plan.comms,
            )
            self.logs[c.name] = EventLog(run_dir, rank=c.index, component=c.name, node=self.node)
        # state snapshots per producer action, as many as the exact-version rule needs
        self.states: dict[str, StateHistory] = {}
        self.keep: dict[str, int] = {}  # producer id -> the largest lag a consumer has on it
        for a in plan.actions:
            for d in a.deps:
                producer = self.by_id[d.id]
                if producer.component != a.component and producer.type != "rollout":
                    lag = effective_lag(plan, a, d, producer)
                    self.keep[d.id] = max(lag, self.keep.get(d.id, 0))
        self.ports = {name: _ComponentPort(self, name) for name in names}
        self.data: dict[tuple[str, int], dict[str, Any]] = {}

    def run(self, iterations: int) -> InProcessResult:
        t_start = time.time()
        self._start_events()
        start = self._make_workloads()
        self._initial_states(start)
        result = InProcessResult(exit_code=0, workloads=self.workloads)
        order = [self.by_id[i] for i in self.plan.order if i in self.by_id]
        order += [a for a in self.plan.actions if a.id not in self.plan.order]
        it = start
        stop = False
        for it in range(start, iterations):
            self._prune(it)
            if it > start and checkpoint_boundary(self.plan, it):
                self._save_all(it)
            stop = self._run_iteration(order, it, result)
            result.iterations_done = it + 1 - start
            for key in [k for k in self.data if k[1] < it - 8]:
                del self.data[key]
            if stop:
                break
        if stop and it + 1 < iterations:
            for name, wl in self.workloads.items():
                self.logs[name].emit("preempt", iteration=it + 1)
                self._checkpoint(name, wl, it + 1, "preempt")
            result.exit_code = self.hooks.stop_exit_code(next(iter(self.ctxs.values())))
        elif not stop and iterations == self.plan.iterations and saves_at_end(self.plan, iterations):
            self._save_all(iterations, "interval" if checkpoint_boundary(self.plan, iterations) else "final")
        for ctx in self.ctxs.values():
            self.hooks.flush_checkpoints(ctx)
        result.wall_s = time.time() - t_start
        for name in self.ctxs:
            self.logs[name].emit("exit", code=result.exit_code, elapsed=result.wall_s)
            self.logs[name].close()
        return result

    def _start_events(self) -> None:
        for c in self.plan.components:
            self.logs[c.name].emit(
                "start", size=len(self.plan.components), comp_rank=0, comp_size=1,
                node_rank=c.index, node_size=len(self.plan.components), pid=os.getpid(),
                host=self.node, mode="inprocess", cpus=c.cpus_per_task,
                gpus=c.gpus_per_node, job_id=None, restart_count=0)

    def _make_workloads(self) -> int:
        """One workload per component that runs actions, restored; the iteration to start at."""
        from .ckpt.state import seed_global_rngs

        cls = load_workload_class(self.plan.workload, self.search)
        seed_global_rngs(self.plan.seed)  # one process, one set of global generators
        used = {a.component for a in self.plan.actions}
        for name, ctx in self.ctxs.items():
            if name in used:
                self.workloads[name] = cls(ctx, **self.plan.workload_args)
                self.ports[name].workload = self.workloads[name]
        start = 0
        for name, wl in self.workloads.items():
            s = self.hooks.restore(self.ctxs[name], wl)
            if s:
                # The restore event itself is written by the hook (resume.py), with
                # restart count and work lost; writing one here would count it twice.
                self.ports[name].version = s
            start = max(start, s)
        return start

    def _run_iteration(self, order: list[ActionSpec], it: int, result: InProcessResult) -> bool:
        """Every component's actions of iteration ``it``; True when a stop was asked for."""
        stop = False
        state: dict[str, IterState] = {}  # per component
        for action in order:
            if not action.runs_at(it):
                continue
            self.ctxs[action.component].iteration = it
            try:
                self._run_action(action, it, state, result)
            except HetrunError:
                raise
            except Exception as exc:
                self.logs[action.component].emit(
                    "error", action=action.id, iteration=it,
                    error=f"{type(exc).__name__}: {exc}", traceback=_tb(exc), code=6)
                raise RuntimeFailure(
                    f"in-process run: component {action.component!r} failed in action "
                    f"{action.id} (iteration {it}): {type(exc).__name__}: {exc}") from exc
            if any(self.hooks.stop_requested(c) for c in self.ctxs.values()):
                stop = True
        return stop

    def _initial_states(self, start: int) -> None:
        """The states consumers load first: a restored producer's saved ones, else its
        weights now, labelled ``start - 1`` (as the MPI executor sends them)."""
        for pid in self.keep:
            comp = self.by_id[pid].component
            saved = self.hooks.restored_pipeline(self.ctxs[comp])
            items = ((saved or {}).get("sent") or {}).get(pid) if isinstance(saved, dict) else None
            history = StateHistory([(int(x["iteration"]), x["state"]) for x in items or []])
            if history.newest is None or history.newest < start - 1:
                tensors = {k: v.detach().clone() for k, v in self.workloads[comp].policy_state().items()}
                history.add(start - 1, tensors)
            self.states[pid] = history

    def _prune(self, it: int) -> None:
        """Drop the states no iteration >= ``it`` can load."""
        for pid, history in self.states.items():
            history.prune(it - self.keep[pid])

    def _save_all(self, boundary: int, reason: str = "interval") -> None:
        for name, wl in self.workloads.items():
            self._checkpoint(name, wl, boundary, reason)
            self.hooks.flush_checkpoints(self.ctxs[name])

    def _pipeline_of(self, comp: str) -> dict[str, Any] | None:
        sent = {pid: [{"iteration": label, "state": t} for label, t in h.items]
                for pid, h in sorted(self.states.items()) if self.by_id[pid].component == comp}
        return {"sent": sent} if sent else None

    def _checkpoint(self, comp: str, wl: Any, resume_at: int, reason: str) -> None:
        self._prune(resume_at)  # the same content whichever path saves at resume_at
        save_state(self.ctxs[comp], self.logs[comp], wl, resume_at, reason=reason,
                   pipeline=self._pipeline_of(comp))

    def _run_action(self, action: ActionSpec, it: int, state: dict[str, IterState],
                    result: InProcessResult) -> None:
        port = self.ports[action.component]
        port.result = result
        port.load_states(action, it)
        run_dispatch(port, action, it, state.setdefault(action.component, IterState()))


class _ComponentPort:
    """The dispatch's ``ActionPort`` for one component (its one rank) of an in-process run."""

    def __init__(self, run: _InProcess, comp: str) -> None:
        self.run = run
        self.comp = comp
        self.plan = run.plan
        self.workload: Any = None  # set once the workloads exist
        self.num_micro = micro_batches_of(run.plan, comp)
        self.loaded: int | None = None  # policy version of the weights loaded from a producer
        self.loaded_from: tuple[str, int] | None = None  # (producer, label) of those weights
        self.version = 0  # optimize steps taken
        self.result: InProcessResult | None = None

    def load_states(self, action: ActionSpec, it: int) -> None:
        """The weights the exact-version rule names, from the components ``action`` depends on."""
        run = self.run
        for dep in action.deps:
            history = run.states.get(dep.id)
            if history is None or run.by_id[dep.id].component == self.comp:
                continue
            picked = pick_for(history, it - effective_lag(run.plan, action, dep, run.by_id[dep.id]))
            if picked is not None and self.loaded_from != (dep.id, picked[0]):
                self.workload.load_policy(picked[1], picked[0] + 1)
                self.loaded = picked[0] + 1
                self.loaded_from = (dep.id, picked[0])

    def rollout_version(self) -> int:
        return self.loaded if self.loaded is not None else self.version

    def incoming_batch(self, action: ActionSpec, it: int) -> Any:
        run = self.run
        batches = [run.data[(d.id, it - effective_lag(run.plan, action, d, run.by_id[d.id]))]
                   for d in action.deps
                   if run.by_id[d.id].type == "rollout" and run.by_id[d.id].component != self.comp]
        if not batches:
            return None
        # One rank per component: a single producer's batch is used as it is.
        return batches[0] if len(batches) == 1 else self.workload.merge_batches(batches)

    def backward(self, micro: int, loss: Any) -> None:
        self.workload.backward(loss)

    def grad_sync(self, action: ActionSpec, sub_id: str, it: int) -> int:
        return 0  # a gradient all-reduce over one rank moves nothing

    def before_optimize(self) -> None:
        pass

    def optimized(self) -> int:
        self.version += 1
        return self.version

    def record_metrics(self, it: int, sub_id: str, metrics: dict[str, Any]) -> None:
        assert self.result is not None
        self.result.metrics.append({"iteration": it, "action": sub_id, **metrics})

    def send_outputs(self, action: ActionSpec, it: int, extra: dict[str, Any],
                     state: IterState) -> int:
        """Keep a rollout's batch and a weight producer's state for their consumers."""
        nbytes = 0
        if "steps" in extra:  # a rollout ran in this dispatch
            self.run.data[(action.id, it)] = state.batch
            assert self.result is not None
            self.result.env_steps += extra["steps"]
            nbytes += _nbytes(state.batch)
        if sends_state_across(self.plan, action):
            tensors = {k: v.detach().clone() for k, v in self.workload.policy_state().items()}
            self.run.states.setdefault(action.id, StateHistory()).add(it, tensors)
            nbytes += _nbytes(tensors)
        return nbytes

    def event_deferred(self, action: ActionSpec) -> bool:
        return False

    def emit(self, kind: str, **fields: Any) -> None:
        self.run.logs[self.comp].emit(kind, **fields)


def _nbytes(tensors: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _tb(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - thin CLI shim
    """``python -m hetrun.runtime.inprocess RUN_DIR``: run a plan in this process."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m hetrun.runtime.inprocess <run_dir>\n")
        return 2
    try:
        res = run_inprocess(args[0])
    except HetrunError as exc:
        sys.stderr.write(f"hetrun.runtime: error: {exc}\n")
        return exc.exit_code
    print(json.dumps({"exit_code": res.exit_code, "iterations": res.iterations_done,
                      "wall_s": round(res.wall_s, 3), "env_steps": res.env_steps}))
    return res.exit_code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

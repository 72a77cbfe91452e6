"""One action dispatch for both executors.

A dispatch is one template action (or a fused group of them) of one
iteration on one rank. What each action type does to the workload is
written once, here (``HANDLERS``); what differs between the MPI executor
(runtime/executor.py) and the in-process one (runtime/inprocess.py) is how a
rank gets its inputs and hands on its outputs: batches and weights from
other components, the gradient all-reduce, where metrics go. Each executor
provides those through ``ActionPort`` (in-process: one port per component).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetrun.errors import RuntimeFailure

from .plan_view import ActionSpec, PlanView

ACTION_TYPES = "rollout, forward, backward, sync, optimize, eval, checkpoint"


def peak_memory_bytes() -> int:
    """Peak resident memory of this process (Linux ru_maxrss is in KiB); GPU peak if used."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak = max(peak, int(torch.cuda.max_memory_allocated()))
    except Exception:  # pragma: no cover - no CUDA here
        pass
    return int(peak)


def sub_actions(plan: PlanView, action: ActionSpec) -> list[tuple[str, str, int | None]]:
    """(id, type, micro) of what one dispatch runs: the action itself or its fused parts."""
    if not action.fused:
        return [(action.id, action.type, action.micro)]
    known = {a.id: a for a in plan.actions}
    parts = []
    for fid in action.fused:
        if fid in known:
            parts.append((fid, known[fid].type, known[fid].micro))
            continue
        head, _, tail = fid.partition(".")
        micro = int(tail[1:]) if tail.startswith("m") and tail[1:].isdigit() else None
        parts.append((fid, head, micro))
    return parts


def micro_batches_of(plan: PlanView, component: str) -> int:
    """How many forward micro-batches one iteration of ``component`` runs (at least 1)."""
    micros = {m for a in plan.actions_of(component) for _, kind, m in sub_actions(plan, a)
              if kind == "forward"}
    return max(len(micros), 1)


def checkpoint_boundary(plan: PlanView, boundary: int) -> bool:
    """True when a ``checkpoint`` action (alone or fused) runs at ``boundary - 1``."""
    return boundary > 0 and any(
        kind == "checkpoint" and a.runs_at(boundary - 1)
        for a in plan.actions for _, kind, _ in sub_actions(plan, a))


def checkpoints_at_all(plan: PlanView) -> bool:
    """The plan has a ``checkpoint`` action (``checkpoint.interval`` above 0)."""
    return any(kind == "checkpoint" for a in plan.actions for _, kind, _ in sub_actions(plan, a))


def saves_at_end(plan: PlanView, boundary: int) -> bool:
    """A checkpoint is written after the iteration before ``boundary``: at every checkpoint
    boundary, and when the run completes (``boundary == plan.iterations``) whatever the interval,
    so a finished run extended with more iterations continues from its last one, none redone."""
    return checkpoint_boundary(plan, boundary) or (boundary == plan.iterations and checkpoints_at_all(plan))


def sends_state_across(plan: PlanView, action: ActionSpec) -> bool:
    """A weight producer: a non-rollout action another component depends on.

    Its consumers load the workload's ``policy_state()`` as it is after the
    dispatch (runtime/state_history.py's exact-version rule).
    """
    return action.type != "rollout" and any(
        d.id == action.id and a.component != action.component
        for a in plan.actions for d in a.deps)


@dataclass
class IterState:
    """One rank's values that live for one iteration."""

    losses: dict[int, Any] = field(default_factory=dict)  # micro-batch -> loss
    batch: Any = None  # this iteration's batch (rollout output or received data)


@dataclass(frozen=True)
class Sub:
    """One part of a dispatch: the action itself, or one member of a fused group."""

    action: ActionSpec
    id: str
    kind: str
    micro: int
    iteration: int


class ActionPort(Protocol):
    """What an executor provides to the dispatch for one rank."""

    plan: PlanView
    workload: Any
    num_micro: int

    def rollout_version(self) -> int:
        """The policy version the rank's loaded weights are (what a rollout reports)."""

    def incoming_batch(self, action: ActionSpec, it: int) -> Any:
        """The batch other components' rollouts sent for ``action``; None: no data deps."""

    def backward(self, micro: int, loss: Any) -> None: ...

    def grad_sync(self, action: ActionSpec, sub_id: str, it: int) -> int:
        """Start the gradient all-reduce of a ``sync``; returns the bytes it moves."""

    def before_optimize(self) -> None:
        """Make the reduced gradients final."""

    def optimized(self) -> int:
        """Count one optimizer step; returns the new policy version."""

    def record_metrics(self, it: int, sub_id: str, metrics: dict[str, Any]) -> None: ...

    def send_outputs(self, action: ActionSpec, it: int, extra: dict[str, Any],
                     state: IterState) -> int:
        """Hand the dispatch's batch / weights to the components that need them; bytes."""

    def event_deferred(self, action: ActionSpec) -> bool:
        """True when the dispatch's event is written later (a sync still reducing)."""

    def emit(self, kind: str, **fields: Any) -> None: ...


Handler = Callable[[ActionPort, Sub, IterState, dict[str, Any]], int]


def _rollout(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    version = port.rollout_version()
    state.batch = port.workload.rollout(version)
    extra["policy_version"] = version
    extra["steps"] = int(port.workload.batch_steps(state.batch))
    return 0


def _forward(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    if state.batch is None:
        state.batch = port.incoming_batch(sub.action, sub.iteration)
    batch = state.batch
    if batch is None:  # supervised: the workload reads its own data, per micro-batch
        batch = port.workload.next_batch(sub.iteration, sub.micro)
        extra["samples"] = extra.get("samples", 0) + int(port.workload.batch_steps(batch))
    state.losses[sub.micro] = port.workload.forward(batch, sub.micro, port.num_micro)
    return 0


def _backward(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    loss = state.losses.pop(sub.micro, None)
    if loss is None:
        raise RuntimeFailure(
            f"{sub.id} of iteration {sub.iteration} has no loss: forward.m{sub.micro} did not run "
            "before it", hint="the plan must make backward.mK depend on forward.mK")
    port.backward(sub.micro, loss)
    return 0


def _sync(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    if sends_state_across(port.plan, sub.action):
        return 0  # a weight sync: send_outputs hands the state on
    return port.grad_sync(sub.action, sub.id, sub.iteration)


def _optimize(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    port.before_optimize()
    metrics = dict(port.workload.optimize() or {})
    extra["metrics"] = metrics
    extra["policy_version"] = port.optimized()
    port.record_metrics(sub.iteration, sub.id, metrics)
    return 0


def _eval(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    metrics = dict(port.workload.evaluate() or {})
    extra["metrics"] = metrics
    port.record_metrics(sub.iteration, sub.id, metrics)
    return 0


def _checkpoint(port: ActionPort, sub: Sub, state: IterState, extra: dict[str, Any]) -> int:
    # The save itself: every component at the boundary, whichever carries the action.
    extra["boundary"] = sub.iteration + 1
    return 0


HANDLERS: dict[str, Handler] = {
    "rollout": _rollout, "forward": _forward, "backward": _backward, "sync": _sync,
    "optimize": _optimize, "eval": _eval, "checkpoint": _checkpoint,
}


def run_dispatch(port: ActionPort, action: ActionSpec, it: int, state: IterState) -> None:
    """Run ``action`` (or its fused parts) of iteration ``it``, hand on its outputs and
    write its ``action`` event."""
    t0 = time.time()
    extra: dict[str, Any] = {}
    nbytes = 0
    for sub_id, kind, micro in sub_actions(port.plan, action):
        handler = HANDLERS.get(kind)
        if handler is None:
            raise RuntimeFailure(f"action {sub_id!r} has type {kind!r}, which this runtime does not "
                                 "execute", hint=f"types: {ACTION_TYPES}")
        nbytes += handler(port, Sub(action, sub_id, kind, 0 if micro is None else micro, it),
                          state, extra)
    nbytes += port.send_outputs(action, it, extra, state)
    if port.event_deferred(action):
        return
    port.emit("action", type=action.type, id=action.id, iteration=it, start=t0, end=time.time(),
              bytes=nbytes, peak_mem=peak_memory_bytes(),
              **({"fused": list(action.fused)} if action.fused else {}), **extra)

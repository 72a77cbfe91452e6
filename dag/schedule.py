"""Priorities, order and packing of the compiled template.

priority = w_qos * qos score + w_util * utilization score (default 0.7 / 0.3).

- qos score: the action's QoS class (low .25, normal .5, high .75, critical 1)
  discounted by its tolerance window: an action that may wait w iterations
  without hurting quality is less urgent, ``class / (1 + w)``.
- utilization score: how fully the action uses the resources of a rank of its
  component (mean of cpu, gpu, memory fractions): scheduling the big consumer
  first keeps the expensive resource busy.

Packing turns the resource groups (actions per component) into het components
and checks that every action fits a rank, and every component fits nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetrun.dag.action import ActionGraph, NodeCapacity, TrainingAction
from hetrun.dag.spec import ComponentSpec, JobSpec

from hetrun.errors import GraphError

QOS_SCORE = {"low": 0.25, "normal": 0.5, "high": 0.75, "critical": 1.0}


@dataclass(frozen=True)
class Weights:
    qos: float = 0.7
    util: float = 0.3


def qos_score(action: TrainingAction) -> float:
    return QOS_SCORE[action.qos] / (1 + action.tolerance_window)


def utilization_score(action: TrainingAction, comp: ComponentSpec) -> float:
    prof = action.resource_profile
    fractions = [min(1.0, prof.cpu / comp.cpus_per_task)]
    if comp.gpus_per_task:
        fractions.append(min(1.0, prof.gpu / comp.gpus_per_task))
    fractions.append(min(1.0, prof.memory_mb / max(1, comp.mem_per_task_mb)))
    gpu_budget = comp.gpu_mem_per_task_mb
    if gpu_budget:
        fractions.append(min(1.0, prof.gpu_memory_mb / gpu_budget))
    return sum(fractions) / len(fractions)


def assign_priorities(graph: ActionGraph, spec: JobSpec, weights: Weights) -> None:
    total = weights.qos + weights.util
    if total <= 0:
        raise GraphError("scheduling weights are both 0", hint="set schedule.qos_weight or util_weight above 0")
    for a in graph:
        score = (weights.qos * qos_score(a)
                 + weights.util * utilization_score(a, spec.components[a.component])) / total
        a.priority = round(score, 4)


def check_fits_rank(graph: ActionGraph, spec: JobSpec) -> None:
    """Every action's profile must fit one rank of its component."""
    for a in graph:
        comp = spec.components[a.component]
        p = a.resource_profile
        where = f"components.{a.component}"
        problems = []  # (message, the actions.<type> key that asks for it)
        if p.cpu > comp.cpus_per_task:
            problems.append((f"{p.cpu} CPUs but a rank has cpus_per_task={comp.cpus_per_task}", "cpu"))
        if p.gpu > comp.gpus_per_task:
            problems.append((f"{p.gpu} GPUs but a rank has {comp.gpus_per_task} "
                             f"(gpus_per_node={comp.gpus_per_node}, tasks_per_node={comp.tasks_per_node})",
                             "gpu"))
        if p.memory_mb > comp.mem_per_task_mb:
            problems.append((f"{p.memory_mb} MB memory but a rank has {comp.mem_per_task_mb} MB "
                             f"(mem={comp.mem} over {comp.tasks_per_node} tasks)", "memory"))
        gpu_budget = comp.gpu_mem_per_task_mb
        if gpu_budget is not None and p.gpu_memory_mb > gpu_budget:
            problems.append((f"{p.gpu_memory_mb} MB GPU memory but a rank has {gpu_budget} MB", "gpu_memory"))
        if problems:
            # Blame the YAML key that asked for more than the component has.
            override = spec.actions.get(a.action_type)
            field = problems[0][1]
            asked = override is not None and getattr(override, field) is not None
            raise GraphError(f"action {a.id!r} cannot run on a rank of component {a.component!r}: "
                             + "; ".join(m for m, _ in problems),
                             hint=f"raise {where} resources or lower actions.{a.action_type} in the job YAML",
                             key_path=f"actions.{a.action_type}.{field}" if asked else where)


def _component_misfit(cname: str, comp: ComponentSpec, capacities: Sequence[NodeCapacity]) -> GraphError | None:
    """Why no set of real nodes can hold ``comp`` as shaped (None: some can)."""
    cpus = comp.cpus_per_task * comp.tasks_per_node
    fitting = [c for c in capacities
               if c.cpus >= cpus and c.gpus >= comp.gpus_per_node and c.mem_mb >= comp.mem_mb]
    if not fitting:
        reasons = []
        if all(c.cpus < cpus for c in capacities):
            reasons.append(f"{cpus} CPUs per node (max {max(c.cpus for c in capacities)})")
        if all(c.gpus < comp.gpus_per_node for c in capacities):
            reasons.append(f"{comp.gpus_per_node} GPUs per node (max {max(c.gpus for c in capacities)})")
        if all(c.mem_mb < comp.mem_mb for c in capacities):
            reasons.append(f"{comp.mem_mb} MB per node (max {max(c.mem_mb for c in capacities)})")
        why = ", ".join(reasons) or "that combination of CPUs, GPUs and memory"
        return GraphError(f"component {cname!r} needs {why}; no node can hold it",
                          hint=f"lower components.{cname} tasks_per_node/cpus_per_task/gpus_per_node/mem")
    if len(fitting) < comp.nodes:
        return GraphError(f"component {cname!r} needs {comp.nodes} nodes with {cpus} CPUs, "
                          f"{comp.gpus_per_node} GPUs, {comp.mem_mb} MB; only {len(fitting)} such nodes exist",
                          hint=f"lower components.{cname}.nodes (or -N {cname}={len(fitting)})")
    return None


def check_fits_nodes(graph: ActionGraph, spec: JobSpec, capacities: Sequence[NodeCapacity]) -> None:
    """Each component's per-node needs, and each action's per-rank needs, must fit real nodes."""
    if not capacities:
        raise GraphError("no node capacities to check against (the cluster reported no nodes)")
    biggest = max(capacities, key=lambda c: (c.gpus, c.cpus, c.mem_mb))

    def describe(c: NodeCapacity) -> str:
        return f"{c.name}: {c.cpus} CPUs, {c.gpus} GPUs, {c.mem_mb} MB"

    from hetrun.dag.needs import reshaped

    for cname, comp in spec.components.items():
        # node_counts: (placement: auto) placement picks a shape: the component fits if one of them does.
        errors = [_component_misfit(cname, shape, capacities)
                  for shape in ([reshaped(comp, n) for n in comp.node_counts] or [comp])]
        if all(errors) and errors[0] is not None:
            raise errors[0]
    for a in graph:
        p = a.resource_profile
        if not any(c.cpus >= p.cpu and c.gpus >= p.gpu and c.mem_mb >= p.memory_mb for c in capacities):
            raise GraphError(f"action {a.id!r} needs {p.cpu} CPUs, {p.gpu} GPUs, {p.memory_mb} MB on one "
                             f"node; no node has that (largest: {describe(biggest)})",
                             hint=f"lower actions.{a.action_type} resources or use a bigger partition")

"""The compiled plan: what ``plan.json`` in a run directory holds (docs/CONTRACTS.md).

``build_plan`` runs the whole planning pipeline: expand -> validate ->
compile (split, 1F1B memory order, fuse) -> priorities -> topological order
-> packing into het components. The runtime reads the result back with
``Plan.from_json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hetrun.dag.action import (
    ActionGraph,
    Dep,
    NodeCapacity,
    ResourceProfile,
    TrainingAction,
    split_id,
)
from hetrun.dag.compile import MemoryEstimate, PassReport, compile_template, describe
from hetrun.dag.expand import expand
from hetrun.dag.schedule import (
    Weights,
    assign_priorities,
    check_fits_nodes,
    check_fits_rank,
)
from hetrun.dag.spec import (
    ACTION_TYPES,
    CheckpointSpec,
    CommsSpec,
    JobSpec,
    PreemptionSpec,
    ScheduleSpec,
    SlurmSpec,
    TrainingSpec,
)
from hetrun.dag.spec_errors import locate_graph_error
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from hetrun import rundir
from hetrun.errors import GraphError, RunDirError

PLAN_VERSION = 1

_PLAN_CONFIG = ConfigDict(extra="forbid")


class PlanDep(BaseModel):
    model_config = _PLAN_CONFIG
    id: str
    lag: int = Field(0, ge=0)
    kind: Literal["data", "memory", "user"] = "data"


class PlanResource(BaseModel):
    model_config = _PLAN_CONFIG
    cpu: int
    gpu: int
    memory_mb: int
    gpu_memory_mb: int


class PlanAction(BaseModel):
    """One dispatch of the per-iteration template (all ranks of ``component`` run it)."""

    model_config = _PLAN_CONFIG
    id: str
    type: str
    component: str
    micro: int | None = None
    deps: list[PlanDep] = Field(default_factory=list)
    tolerance_window: int = 0
    qos: str = "normal"
    priority: float = 0.0
    resource: PlanResource
    fused: list[str] = Field(default_factory=list)
    every: int = Field(1, ge=1, description="runs on iterations i with (i + 1) % every == 0")

    def runs_at(self, iteration: int) -> bool:
        return rundir.runs_at(self.every, iteration)

    def members(self) -> list[str]:
        """The action ids this dispatch runs, in order (itself when not fused)."""
        return self.fused or [self.id]


class PlacementChoice(BaseModel):
    """Where ``hetrun submit`` placed a ``placement: auto`` (or ``--fit``) component, and why."""

    model_config = _PLAN_CONFIG
    partition: str
    gres: str = Field(description='the GRES group: "gpu:a100", "gpu" (untyped) or "-" (no GPUs)')
    score: float
    start_in_s: float | None = Field(None, description="Slurm's start estimate (sbatch --test-only)")
    nodes: list[str] = Field(default_factory=list, description="the nodes free for it when it was placed")
    reasons: list[str] = Field(default_factory=list)
    others: list[str] = Field(default_factory=list, description="the candidates that lost, with their score "
                                                                "and reasons")
    pool_taken_at: float = Field(0.0, description="epoch seconds of the pool snapshot it was scored against")
    node_count: int | None = Field(None, description="the node count it was spread over (node_counts:); the "
                                                     "component's nodes / tasks_per_node are that shape")
    ranked: list[str] = Field(default_factory=list, description="placement: ranked: the kept candidates' "
                                                                "partitions best first, handed to Slurm as one "
                                                                "--partition=a,b (empty: one partition, partition)")
    nodelist: list[str] = Field(default_factory=list,
                                description="a start by preemption: the nodes of the jobs whose preemption loses "
                                            "least, handed to Slurm as --nodelist (it takes the rest from idle "
                                            "nodes; empty: Slurm picks every node, and its own victims)")

    @property
    def gpu_type(self) -> str | None:
        return self.gres.partition(":")[2] or None


class ComponentPlan(BaseModel):
    model_config = _PLAN_CONFIG
    name: str
    index: int
    nodes: int
    tasks_per_node: int
    ntasks: int
    cpus_per_task: int
    gpus_per_node: int
    mem_mb: int
    actions: list[str]
    command: list[str] | None = Field(
        default=None, description="argv every rank runs (a command component; no actions)")
    placement: PlacementChoice | None = Field(
        default=None, description="set by hetrun submit for a placement: auto (or --fit) component")
    spare_nodes: int = Field(default=0, description="idle nodes held for an in-allocation restart")
    min_nodes: int | None = Field(
        default=None, description="the fewest nodes its ranks may be packed onto after a node death "
                                  "(None: nodes, no packing)")

    @property
    def packs(self) -> bool:
        """Whether a node death with no spare left packs its ranks onto fewer nodes."""
        return self.min_nodes is not None and self.min_nodes < self.nodes

    @property
    def runs_actions(self) -> bool:
        """An action component (its ranks run the plan's actions), not a command's."""
        return self.command is None

    @model_serializer(mode="wrap")
    def _without_null_command(self, handler: Any) -> dict[str, Any]:
        # An action component's entry reads as before: "command" / "placement" only where there is one.
        data = handler(self)
        for key in ("command", "placement"):
            if data.get(key) is None:
                data.pop(key, None)
        if not data.get("spare_nodes"):
            data.pop("spare_nodes", None)
        if data.get("min_nodes") is None:
            data.pop("min_nodes", None)
        return data


class MemoryPlan(BaseModel):
    model_config = _PLAN_CONFIG
    component: str
    resource: str
    budget_mb: int | None
    model_state_mb: int
    activation_mb: int
    inflight_before: int
    inflight_after: int
    peak_before_mb: int
    peak_after_mb: int


class Plan(BaseModel):
    model_config = _PLAN_CONFIG
    version: int = PLAN_VERSION
    name: str
    workload: str | None = None  # None: every component runs a command
    workload_args: dict[str, Any] = Field(default_factory=dict)
    training: TrainingSpec | None = None
    components: list[ComponentPlan]
    actions: list[PlanAction]
    order: list[str]
    checkpoint: CheckpointSpec
    preemption: PreemptionSpec
    env: dict[str, str] = Field(default_factory=dict)
    comms: CommsSpec
    slurm: SlurmSpec
    schedule: ScheduleSpec
    memory: MemoryPlan | None = None
    job_dir: str | None = Field(
        default=None, description="absolute directory of the job YAML, set by `hetrun submit`: the ranks "
                                  "import workload modules that live next to the YAML from it")

    def to_json(self) -> str:
        """plan.json's text: json.dumps' form (ASCII: non-ASCII values escaped), as every
        writer of the file (submit, resume, `hetrun plan --json`) writes it."""
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, source: str = rundir.PLAN_JSON) -> Plan:
        """Parse a plan; a damaged or foreign file is a ``RunDirError`` naming what is wrong."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise RunDirError(f"{source}: not valid JSON ({exc})",
                              hint="the run directory is damaged; re-submit the job") from None
        if not isinstance(raw, dict):
            raise RunDirError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        version = raw.get("version")
        if version != PLAN_VERSION:
            raise RunDirError(f"{source}: plan version {version!r}; this hetrun reads version {PLAN_VERSION}",
                              hint="plan and run it with the same hetrun version")
        try:
            plan = cls.model_validate(raw, strict=False)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise RunDirError(f"{source}: {loc}: {first['msg']}",
                              hint="the run directory is damaged or from another hetrun version") from None
        plan._check_consistent(source)
        return plan

    def _check_consistent(self, source: str) -> None:
        ids = {a.id for a in self.actions}
        names = {c.name for c in self.components}
        for a in self.actions:
            if a.component not in names:
                raise RunDirError(f"{source}: action {a.id!r} names unknown component {a.component!r}")
            for d in a.deps:
                if d.id not in ids:
                    raise RunDirError(f"{source}: action {a.id!r} depends on unknown action {d.id!r}")
        if sorted(self.order) != sorted(ids):
            raise RunDirError(f"{source}: order does not list every action exactly once")

    # -- helpers for the runtime and reports ------------------------------------------------

    def action(self, action_id: str) -> PlanAction:
        for a in self.actions:
            if a.id == action_id:
                return a
        raise KeyError(action_id)

    @property
    def action_components(self) -> list[ComponentPlan]:
        """The components whose ranks run actions (one MPI world), in plan order; the same
        rule as the run directory's view (hetrun/planfile.py PlanView.action_components)."""
        return [c for c in self.components if c.runs_actions]

    def component(self, name: str) -> ComponentPlan:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    def actions_of(self, component: str) -> list[PlanAction]:
        """The component's dispatches, in ``order``."""
        by_id = {a.id: a for a in self.actions}
        return [by_id[i] for i in self.order if by_id[i].component == component]

    def graph(self) -> ActionGraph:
        """The template back as an ``ActionGraph`` (for unrolling and display)."""
        return ActionGraph(
            TrainingAction(a.id, a.type, a.component,
                           ResourceProfile(a.resource.cpu, a.resource.gpu, a.resource.memory_mb,
                                           a.resource.gpu_memory_mb),
                           [Dep(d.id, d.lag, d.kind) for d in a.deps], a.tolerance_window, a.qos,
                           a.micro, a.every, list(a.fused), a.priority)
            for a in self.actions)


@dataclass
class PlanBuild:
    """A plan plus how it came to be (for ``hetrun plan --explain``)."""

    plan: Plan
    template: ActionGraph  # coarse, before compiling
    compiled: ActionGraph
    passes: list[PassReport] = field(default_factory=list)
    memory: MemoryEstimate | None = None


def _to_plan_action(a: TrainingAction) -> PlanAction:
    p = a.resource_profile
    return PlanAction(
        id=a.id, type=a.action_type, component=a.component, micro=a.micro,
        deps=[PlanDep(id=d.id, lag=d.lag, kind=d.kind) for d in a.deps],
        tolerance_window=a.tolerance_window, qos=a.qos, priority=a.priority,
        resource=PlanResource(cpu=p.cpu, gpu=p.gpu, memory_mb=p.memory_mb, gpu_memory_mb=p.gpu_memory_mb),
        fused=list(a.fused), every=a.every,
    )


def _components(spec: JobSpec, graph: ActionGraph) -> list[ComponentPlan]:
    """Resource groups -> het components, in the spec's order (= het group index)."""
    types_of: dict[str, set[str]] = {name: set() for name in spec.components}
    for a in graph:
        for member in a.fused or [a.id]:
            types_of[a.component].add(split_id(member)[0])
        types_of[a.component].add(a.action_type)
    out = []
    for index, (name, comp) in enumerate(spec.components.items()):
        listed = [t for t in ACTION_TYPES if t in types_of[name] or t in comp.actions]
        out.append(ComponentPlan(
            name=name, index=index, nodes=comp.nodes, tasks_per_node=comp.tasks_per_node,
            ntasks=comp.ntasks, cpus_per_task=comp.cpus_per_task, gpus_per_node=comp.gpus_per_node,
            mem_mb=comp.mem_mb, actions=listed, command=comp.command, spare_nodes=comp.spare_nodes,
            min_nodes=comp.min_nodes if comp.min_nodes is not None and comp.min_nodes < comp.nodes else None,
        ))
    return out


def build_plan_explained(
    spec: JobSpec,
    *,
    weights: Weights | tuple[float, float] | None = None,
    capacities: Sequence[NodeCapacity] | None = None,
) -> PlanBuild:
    """Plan ``spec`` and keep every intermediate graph for display.

    A ``GraphError`` caused by a job YAML key names that key's file:line:col.
    """
    try:
        return _build(spec, weights, capacities)
    except GraphError as exc:
        raise locate_graph_error(exc, spec) from None


def _build(
    spec: JobSpec,
    weights: Weights | tuple[float, float] | None,
    capacities: Sequence[NodeCapacity] | None,
) -> PlanBuild:
    if weights is None:
        w = Weights(spec.schedule.qos_weight, spec.schedule.util_weight)
    elif isinstance(weights, Weights):
        w = weights
    else:
        w = Weights(*weights)
    if spec.training is None:
        # Command components only: no action loop to expand; the plan carries their argv.
        empty = ActionGraph()
        if capacities is not None:
            check_fits_nodes(empty, spec, capacities)
        plan = Plan(name=spec.name, components=_components(spec, empty), actions=[], order=[],
                    checkpoint=spec.checkpoint, preemption=spec.preemption, env=spec.env, comms=spec.comms,
                    slurm=spec.slurm, schedule=spec.schedule)
        return PlanBuild(plan, empty, empty)
    template = expand(spec)
    # Resource checks on the coarse template, so errors name action types the user wrote.
    # Without cluster capacities the spec is its own capacity: every action must fit a
    # rank of its component. With them, every component must also fit real nodes.
    check_fits_rank(template, spec)
    if capacities is not None:
        check_fits_nodes(template, spec, capacities)
    compiled, passes, memory = compile_template(template, spec)
    assign_priorities(compiled, spec, w)
    order = compiled.topological_order()
    plan = Plan(
        name=spec.name, workload=spec.workload, workload_args=spec.workload_args,
        training=spec.training, components=_components(spec, compiled),
        actions=[_to_plan_action(a) for a in compiled], order=order,
        checkpoint=spec.checkpoint, preemption=spec.preemption, env=spec.env, comms=spec.comms,
        slurm=spec.slurm, schedule=spec.schedule.model_copy(update={"qos_weight": w.qos, "util_weight": w.util}),
        memory=None if memory is None else MemoryPlan(
            component=memory.component, resource=memory.resource, budget_mb=memory.budget_mb,
            model_state_mb=memory.model_state_mb, activation_mb=memory.activation_mb,
            inflight_before=memory.inflight_before, inflight_after=memory.inflight_after,
            peak_before_mb=memory.peak_before_mb, peak_after_mb=memory.peak_after_mb),
    )
    return PlanBuild(plan, template, compiled, passes, memory)


def build_plan(
    spec: JobSpec,
    *,
    weights: Weights | tuple[float, float] | None = None,
    capacities: Sequence[NodeCapacity] | None = None,
) -> Plan:
    """expand -> compile -> schedule -> pack. Raises ``GraphError`` for an impossible job.

    ``weights``: (qos, util) priority weights; default from ``spec.schedule`` (0.7 / 0.3).
    ``capacities``: node capacities from the cluster (``sinfo``); default: the spec's own.
    """
    return build_plan_explained(spec, weights=weights, capacities=capacities).plan


__all__ = ["ComponentPlan", "PlacementChoice", "Plan", "PlanAction", "PlanBuild", "PlanDep", "build_plan",
           "build_plan_explained", "describe"]

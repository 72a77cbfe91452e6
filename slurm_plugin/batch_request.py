"""The typed submit request: everything a batch script is written from, built once.

``build_request(spec, plan)`` gathers, from the typed ``JobSpec`` (the job file with
its overrides applied) and the ``Plan`` (its het components, with the placement
``hetrun submit`` chose), one frozen ``BatchRequest``: per het component its
Slurm options, command and placement; for the job its Slurm options, signal,
grace period, budgets, environment and restart base. torchx's
``SlurmBatchRequest`` is the model. ``render.write_sbatch`` only writes it out.

Validation: the ranges and cross-field rules are the spec's own (``dag/spec.py``'s
fields and validators) and are not checked again here. Every string that reaches
the script still passes ``quoting``'s gate (the same rules as the spec's, from
``dag/validators.py``): a spec or plan built in code without validation
(``model_construct``, a field assigned after the fact) must not put a newline
into an ``#SBATCH`` line or a ``$(...)`` into the shell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetrun.dag.budgets import Budgets

from hetrun.errors import SpecError

from . import quoting
from .rundir import restart_base_of_env

if TYPE_CHECKING:
    from hetrun.dag.plan import ComponentPlan, PlacementChoice, Plan
    from hetrun.dag.spec import JobSpec


@dataclass(frozen=True)
class ComponentRequest:
    """One het component's ``#SBATCH`` block and launch: its shape, command and placement."""

    name: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    mem_mb: int
    command: tuple[str, ...] | None = None  # a command component's argv (None: it runs actions)
    # Its partition: the placement's (placement: auto / ranked, plan.json components[i].placement;
    # ranked: "a,b"), else the job's slurm.partition; None: Slurm's default. The GPU type: the placement's.
    partition: str | None = None
    gpu_type: str | None = None
    # A start by preemption: the nodes placement named (plan.json components[i].placement.nodelist).
    nodelist: tuple[str, ...] = ()
    spare_nodes: int = 0  # allocated beside ``nodes``, idle until a node dies (in-allocation restart)
    # With no spare left, the fewest nodes the ranks may be packed onto (None: nodes, no packing).
    min_nodes: int | None = None

    @property
    def recovers(self) -> bool:
        """Whether a node death restarts this component inside the allocation (a spare, or packing)."""
        return bool(self.spare_nodes) or (self.min_nodes is not None and self.min_nodes < self.nodes)


@dataclass(frozen=True)
class SlurmOptions:
    """The job's ``slurm:`` and ``preemption:`` values the script needs, gated."""

    partition: str | None
    account: str | None
    qos: str | None
    time: str | None
    constraint: str | None
    extra_job: tuple[str, ...]  # slurm.extra options Slurm reads once, from the first component
    extra_component: tuple[str, ...]  # slurm.extra options repeated in every component
    signal: str
    grace_seconds: int
    budgets: Budgets


@dataclass(frozen=True)
class BatchRequest:
    """Everything the batch script is written from (``render.write_sbatch``)."""

    name: str
    components: tuple[ComponentRequest, ...]
    options: SlurmOptions
    env: tuple[tuple[str, str], ...]  # sorted: the script must not depend on dict order
    restart_base: int  # the first attempt's restart count (`hetrun resume` sets it)


def _placement(choice: PlacementChoice | None, key_path: str) -> tuple[str | None, str | None]:
    """(partition, GPU type) ``hetrun submit`` chose for the component; (None, None): not placed."""
    if choice is None:
        return None, None
    gtype = choice.gpu_type
    if gtype is not None:
        gtype = quoting.gpu_type(gtype, f"{key_path}.gres")
    if choice.ranked:  # placement: ranked: every kept partition, best first
        names = [quoting.one_partition(p, f"{key_path}.ranked[{i}]") for i, p in enumerate(choice.ranked)]
        return ",".join(names), gtype
    return quoting.partition(choice.partition, f"{key_path}.partition"), gtype


def _nodelist(choice: PlacementChoice | None, key_path: str) -> tuple[str, ...]:
    """The nodes placement named for a start by preemption, each a checked Slurm name."""
    if choice is None:
        return ()
    return tuple(quoting.slurm_name(n, f"{key_path}.nodelist[{i}]") for i, n in enumerate(choice.nodelist))


def _component(i: int, c: ComponentPlan, job_partition: str | None) -> ComponentRequest:
    name = quoting.component_name(c.name, f"components[{i}].name")
    kp = f"components.{name}"
    partition, gpu_type = _placement(c.placement, f"{kp}.placement")
    if partition is None:
        partition = job_partition
    return ComponentRequest(
        name=name, nodes=c.nodes, tasks_per_node=c.tasks_per_node, cpus_per_task=c.cpus_per_task,
        gpus_per_node=c.gpus_per_node, mem_mb=c.mem_mb,
        command=None if c.command is None else tuple(quoting.command(c.command, f"{kp}.command")),
        partition=partition, gpu_type=gpu_type, nodelist=_nodelist(c.placement, f"{kp}.placement"),
        spare_nodes=c.spare_nodes,
        min_nodes=min(c.min_nodes, c.nodes) if c.packs and c.min_nodes is not None else None)


def slurm_options(spec: JobSpec) -> SlurmOptions:
    """The job-wide options of ``spec`` (its ``slurm:`` and ``preemption:`` sections)."""
    slurm, pre = spec.slurm, spec.preemption
    extra_job: list[str] = []
    extra_comp: list[str] = []
    for i, item in enumerate(slurm.extra):
        name, arg = quoting.extra_option(item, f"slurm.extra[{i}]")
        line = f"--{name}" if arg is None else f"--{name}={arg}"
        (extra_job if name in quoting.EXTRA_JOB_WIDE else extra_comp).append(line)

    def gated(value: str | None, gate: quoting.Gate, key: str) -> str | None:
        return None if value in (None, "") else gate(value, f"slurm.{key}")

    return SlurmOptions(
        partition=gated(slurm.partition, quoting.partition, "partition"),
        account=gated(slurm.account, quoting.slurm_name, "account"),
        qos=gated(slurm.qos, quoting.slurm_name, "qos"),
        time=gated(slurm.time, quoting.time_limit, "time"),
        constraint=gated(slurm.constraint, quoting.constraint, "constraint"),
        extra_job=tuple(extra_job),
        extra_component=tuple(extra_comp),
        signal=quoting.signal_name(pre.signal),
        grace_seconds=pre.grace_seconds,  # the spec's field holds its range (hetrun.rundir.GRACE_SECONDS_RANGE)
        budgets=Budgets.from_preemption(pre.model_dump()),
    )


def build_request(spec: JobSpec, plan: Plan) -> BatchRequest:
    """The request for ``plan`` (its components, placed) under ``spec`` (job name, Slurm options,
    preemption, environment; overrides already applied). Raises ``SpecError`` naming the key path
    of a value that cannot go into a script."""
    if not plan.components:
        raise SpecError("the plan has no components", key_path="components",
                        hint="declare at least one component under components:")
    # Sorted: the script must not depend on dict order (golden files).
    env = tuple((quoting.env_key(k, f"env.{k}"), quoting.env_value(spec.env[k], f"env.{k}"))
                for k in sorted(spec.env))
    options = slurm_options(spec)
    return BatchRequest(name=quoting.job_name(spec.name, "name"),
                        components=tuple(_component(i, c, options.partition) for i, c in enumerate(plan.components)),
                        options=options, env=env, restart_base=restart_base_of_env(spec.env))


__all__ = ["BatchRequest", "ComponentRequest", "SlurmOptions", "build_request", "slurm_options"]

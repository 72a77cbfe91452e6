"""The job spec: pydantic models of the job YAML (docs/CONTRACTS.md) and its loader.

Every section is its own model with ``extra="forbid"`` and strict types, so a
misspelt key or a quoted number is an error with the closest valid key, never
a silent default. ``load_spec`` is the one entry point: YAML file -> overrides
-> validation -> ``JobSpec``; it raises only ``SpecError``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from hetrun.dag import validators as v
from hetrun.dag.object_store_spec import ObjectStoreSpec
from hetrun.dag.overrides import Overrides, apply_overrides
from hetrun.dag.sbatch_options import check_extra_option
from hetrun.dag.spec_errors import SpecIssue, attach_source, translate_validation_error
from hetrun.dag.yaml_source import _EXP_FLOAT_RE as EXP_FLOAT_RE
from hetrun.dag.yaml_source import SourceDoc, read_yaml_file
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from hetrun.errors import SpecError
from hetrun.rundir import DEFAULTS, GRACE_SECONDS_RANGE

ActionType = Literal["forward", "backward", "optimize", "sync", "rollout", "checkpoint", "eval"]
ACTION_TYPES: tuple[str, ...] = ("rollout", "forward", "backward", "sync", "optimize", "checkpoint", "eval")
QosClass = Literal["low", "normal", "high", "critical"]

# Action types each training kind cannot do without; the others (sync,
# checkpoint, eval) default to the component that runs optimize.
REQUIRED_ACTIONS: dict[str, tuple[str, ...]] = {
    "rl": ("rollout", "forward", "backward", "optimize"),
    "supervised": ("forward", "backward", "optimize"),
}

# Editors see what the validators accept: sizes and times may be written as numbers too.
MemSize = Annotated[str, WithJsonSchema({
    "anyOf": [{"type": "string", "pattern": r"^[0-9]{1,12}[KMGTkmgt]?[Bb]?$"}, {"type": "integer", "minimum": 1}],
    "description": "Slurm memory size: number with K/M/G/T suffix (default M)"})]
SlurmTime = Annotated[str, WithJsonSchema({
    "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}], "description": v.TIME_FORMATS_HELP})]
Command = Annotated[list[str], WithJsonSchema({
    "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
    "description": "the program each rank runs: an argv list, or a string split as a shell would "
                   "(no variables, globs or pipes)"})]

# Placements hetrun submit scores against the pool (partitions: / gpu_types: / node_counts: apply):
# auto picks one candidate; ranked hands Slurm the kept candidates' partitions best first.
PLACED_MODES = ("auto", "ranked")
_MODEL_CONFIG = ConfigDict(extra="forbid", strict=True, frozen=False, validate_default=True)


class _Section(BaseModel):
    model_config = _MODEL_CONFIG


class ComponentSpec(_Section):
    """One het component: identical nodes running the listed action types, or the
    user's own program (``command:``) with torchrun's variables per rank."""

    nodes: int = Field(1, ge=1, le=100_000, description="nodes of this component")
    tasks_per_node: int = Field(1, ge=1, le=1024, description="MPI ranks per node")
    cpus_per_task: int = Field(1, ge=1, le=4096, description="CPU cores per rank")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node (gres gpu:N)")
    mem: MemSize = Field("1G", description="memory per node, Slurm size with K/M/G/T suffix")
    gpu_mem: MemSize | None = Field(None, description="memory of one GPU, for the planner's memory check")
    actions: list[ActionType] = Field(default_factory=list,
                                      description="action types this component runs (not with command)")
    command: Command | None = Field(None, description="the user's program every rank of this component "
                                                      "runs instead of actions (torchrun variables per rank)")
    placement: Literal["fixed", "auto", "ranked"] = Field(
        "fixed", description="fixed: slurm.partition and gres gpu:N as written; auto: hetrun submit picks the "
                             "partition and GPU type expected to start first; ranked: it hands Slurm every "
                             "candidate partition best first (--partition=a,b) and Slurm starts it in the one "
                             "free first (docs/CONTRACTS.md, placement)")
    partitions: list[str] = Field(default_factory=list, max_length=64,
                                  description="placement: auto / ranked only: the partitions it may pick (default: "
                                              "slurm.partition if set, else any)")
    gpu_types: list[str] = Field(default_factory=list, max_length=64,
                                 description="placement: auto / ranked only: the GPU (GRES) types it may pick, e.g. "
                                             "[a100, v100] (default: any)")
    spare_nodes: int = Field(
        0, ge=0, le=1000,
        description="extra nodes allocated with the component and left idle; when a rank or node dies the "
                    "job's batch script restarts the step on the survivors plus a spare, inside the allocation "
                    "(a job of action components, or of one command component resuming through the run API; "
                    "docs/PREEMPTION.md, node failure)")
    min_nodes: int | None = Field(
        None, ge=1, le=100_000,
        description="the fewest nodes this component may go on with when a node dies and no spare is left: "
                    "the job restarts inside its allocation with the component's ranks packed onto its "
                    "surviving nodes (the same ranks: the run stays bit-identical; each survivor runs more "
                    "of them, slower) instead of requeueing; default: nodes (no packing). Action components "
                    "without GPUs (docs/PREEMPTION.md, node failure)")
    node_counts: list[int] = Field(default_factory=list, max_length=16,
                                   description="placement: auto / ranked only: node counts it may be spread over, its "
                                               "ranks, GPUs and memory in total staying those of nodes: (e.g. "
                                               "[1, 2, 4]; default: nodes: only)")

    @field_validator("mem", mode="before")
    @classmethod
    def _mem(cls, value: Any) -> str:
        return v.check_mem(value)

    @field_validator("gpu_mem", mode="before")
    @classmethod
    def _gpu_mem(cls, value: Any) -> str | None:
        return None if value is None else v.check_mem(value)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> list[str] | None:
        return None if value is None else v.check_command(value)

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, value: list[str]) -> list[str]:
        return _checked_list(value, v.check_one_partition)

    @field_validator("gpu_types")
    @classmethod
    def _gpu_types(cls, value: list[str]) -> list[str]:
        return _checked_list(value, v.check_gpu_type)

    @field_validator("node_counts")
    @classmethod
    def _node_counts(cls, value: list[int]) -> list[int]:
        return _checked_list(value, v.check_node_count)

    @field_validator("actions")
    @classmethod
    def _unique_actions(cls, value: list[str]) -> list[str]:
        dupes = sorted({a for a in value if value.count(a) > 1})
        if dupes:
            raise ValueError(f"action types listed twice: {', '.join(dupes)}")
        return value

    @property
    def mem_mb(self) -> int:
        return v.mem_to_mb(self.mem)

    @property
    def is_command(self) -> bool:
        return self.command is not None

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def gpus_per_task(self) -> int:
        # Ranks that outnumber the GPUs share them; each still needs one.
        return -(-self.gpus_per_node // self.tasks_per_node) if self.gpus_per_node else 0

    @property
    def mem_per_task_mb(self) -> int:
        return self.mem_mb // self.tasks_per_node

    @property
    def gpu_mem_per_task_mb(self) -> int | None:
        """GPU memory one rank may use; None when the spec does not say (no GPU memory check)."""
        if self.gpu_mem is None or not self.gpus_per_node:
            return None
        return v.mem_to_mb(self.gpu_mem) * self.gpus_per_node // self.tasks_per_node


def _checked_list(value: list[Any], check: Any) -> list[Any]:
    """Each entry checked, none twice (the error names the entry; its position is the list's)."""
    for i, item in enumerate(value):
        try:
            check(item)
        except ValueError as exc:
            raise ValueError(f"entry {i}: {exc}") from None
    dupes = sorted({x for x in value if value.count(x) > 1})
    if dupes:
        raise ValueError(f"listed twice: {', '.join(map(str, dupes))}")
    return value


def _check_placement(cname: str, comp: ComponentSpec) -> None:
    """Lists of candidates mean nothing to a fixed component: refused rather than ignored."""
    for key in ("partitions", "gpu_types", "node_counts"):
        if getattr(comp, key) and comp.placement not in PLACED_MODES:
            raise SpecIssue(f"{key} lists candidates for placement: auto / ranked, but component {cname!r} has "
                            f"placement: {comp.placement}", path=("components", cname, key),
                            hint=f"add placement: auto (or ranked) to {cname}, or remove {key}:")
    if comp.gpu_types and not comp.gpus_per_node:
        raise SpecIssue(f"gpu_types is set but component {cname!r} has gpus_per_node 0 (no GPU to choose a "
                        "type for)", path=("components", cname, "gpu_types"),
                        hint="set gpus_per_node, or remove gpu_types:")
    gpus = comp.nodes * comp.gpus_per_node
    for n in comp.node_counts:  # the job's ranks and GPUs split evenly over each count, or it is no option
        if comp.ntasks % n or gpus % n:
            raise SpecIssue(f"node_counts entry {n}: component {cname!r} has {comp.ntasks} ranks and {gpus} GPUs "
                            f"({comp.nodes} nodes x {comp.tasks_per_node} ranks, {comp.gpus_per_node} GPUs), "
                            f"which do not split evenly over {n} nodes", path=("components", cname, "node_counts"),
                            hint="list only node counts that divide both the ranks and the GPUs")


class TrainingSpec(_Section):
    kind: Literal["rl", "supervised"] = Field(description="rl (rollouts + learner) or supervised")
    iterations: int = Field(ge=1, le=1_000_000_000)
    micro_batches: int = Field(1, ge=1, le=4096, description="micro-batches per iteration")
    pipeline_window: int = Field(1, ge=1, le=64, description="iterations that may overlap")
    seed: int = Field(0, ge=0, le=2**32 - 1)
    eval_interval: int = Field(0, ge=0, le=1_000_000_000, description="eval every N iterations; 0 = never")
    mode: Literal["pipelined", "coarse"] = Field(
        "pipelined", description="coarse = the synchronous loop (components wait for each other)")


class ActionOverride(_Section):
    """Per-action-type settings; unset fields keep hetrun's defaults."""

    tolerance_window: int | None = Field(None, ge=0, le=1000,
                                         description="iterations this action may lag (stale weights)")
    qos: QosClass | None = None
    cpu: int | None = Field(None, ge=1, le=4096, description="CPU cores per rank it needs")
    gpu: int | None = Field(None, ge=0, le=64, description="GPUs per rank it needs")
    memory: MemSize | None = Field(None, description="host memory per rank it holds (e.g. 512M)")
    gpu_memory: MemSize | None = Field(None, description="GPU memory per rank it holds (e.g. 4G)")
    after: list[ActionType] = Field(default_factory=list,
                                    description="extra action types of the same iteration to run after")

    @field_validator("memory", "gpu_memory", mode="before")
    @classmethod
    def _mem(cls, value: Any) -> str | None:
        return None if value is None else v.check_mem(value)


class SlurmSpec(_Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: SlurmTime | None = Field(None, description=v.TIME_FORMATS_HELP)
    constraint: str | None = None
    extra: list[str] = Field(default_factory=list, description="extra sbatch long options")

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        return None if value is None else v.check_partition(value)

    @field_validator("account", "qos")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else v.check_slurm_name(value)

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        return None if value is None else v.check_constraint(value)

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, value: Any) -> str | None:
        return None if value is None else v.check_time(value)

    @field_validator("extra")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for i, item in enumerate(value):
            problem = check_extra_option(item)
            if problem:
                raise SpecIssue(problem, path=("slurm", "extra", i))
        return value

    @property
    def time_seconds(self) -> int | None:
        return None if self.time is None else v.time_seconds(self.time)


class CheckpointSpec(_Section):
    interval: int = Field(DEFAULTS.checkpoint_interval, ge=0, le=1_000_000_000,
                          description="checkpoint every N iterations; 0 = never")
    directory: str | None = Field(None, description="default: <run_dir>/ckpt")
    keep: int = Field(DEFAULTS.checkpoint_keep, ge=1, le=10_000)
    optimizer_encoding: Literal["exact", "lossy-4bit"] = Field(
        DEFAULTS.optimizer_encoding,  # type: ignore[arg-type]
        description="exact (default) or lossy-4bit: LOSSY, Adam moments (exp_avg, exp_avg_sq) stored as "
                    "blockwise 4-bit codes (~0.35x of torch.save for AdamW); weights, steps and RNG stay exact",
    )
    max_delta_chain: int = Field(
        DEFAULTS.max_delta_chain, ge=1, le=64,
        description="longest chain of delta checkpoints a chunk may depend on (1 = every checkpoint "
                    "standalone). Longer: fewer bytes; shorter: faster restore (benchmarks/ckpt.md)",
    )

    memory_every: int | Literal["auto"] | None = Field(
        DEFAULTS.memory_every,
        description="snapshot every rank's state into node-local memory (and replicate it to another node) "
                    "every N iterations; 0 = off; auto = adaptive (the smallest power of two N <= "
                    "memory_every_max whose snapshots take <= 2% of training; a node death then costs "
                    "<= N iterations); default: auto with spare_nodes, else off")
    memory_every_max: int = Field(
        DEFAULTS.memory_every_max, ge=1, le=1024,
        description="auto's largest N, a power of two (default 1: a snapshot every iteration, so a "
                    "node death costs at most the iteration it interrupted; where the snapshots cost more "
                    "than 2% at that N, `hetrun report` says so: raise it to trade iterations lost for speed)")
    memory_replicas: int = Field(DEFAULTS.memory_replicas, ge=1, le=8, description="copies of each snapshot sent to ranks on other nodes")

    object_store: ObjectStoreSpec | None = Field(
        None, description="S3-compatible cold tier after the file tiers: {url: s3://BUCKET/PREFIX, "
                          "endpoint: ...}; credentials only from AWS_* variables / ~/.aws (docs/OBJECT_STORE.md)")

    @field_validator("memory_every", mode="before")
    @classmethod
    def _memory_every(cls, value: Any) -> Any:
        # One message for both spellings (the union's two errors would name pydantic's branches).
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000_000:
            raise ValueError(f"expected a whole number of iterations >= 0 (0 = off) or 'auto', got {value!r}")
        return value

    @field_validator("memory_every_max")
    @classmethod
    def _memory_every_max(cls, value: int) -> int:
        # The ranks agree on N as its log2 (runtime/memory_tier.py): a power of two.
        if value & (value - 1):
            low = 1 << (value.bit_length() - 1)
            raise ValueError(f"expected a power of two (1, 2, 4, 8, ...), got {value}; use {low} or {low * 2}")
        return value

    @field_validator("directory")
    @classmethod
    def _directory(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value:
            raise ValueError("empty directory; leave it out for <run_dir>/ckpt")
        return v.check_plain_string(value, "directory")


class PreemptionSpec(_Section):
    signal: str = Field(DEFAULTS.preemption_signal, description="signal Slurm sends before the time limit")
    grace_seconds: int = Field(DEFAULTS.grace_seconds, ge=GRACE_SECONDS_RANGE[0], le=GRACE_SECONDS_RANGE[1],
                               description="seconds between the signal and the kill")
    # Budgets (hetrun.dag.budgets): preemptions and failures are limited apart.
    max_preemptions: int | None = Field(
        None, ge=0, le=1_000_000,
        description="preemptions + time-limit requeues a run may take; null (default) = unlimited")
    max_failures: int = Field(
        DEFAULTS.max_failures, ge=0, le=1000,
        description="failures (a rank died or raised) to requeue and resume from the newest checkpoint; "
                    "0 (default) = a failure ends the run")
    max_restarts: int | None = Field(
        None, ge=0, le=1000,
        description="old name of max_preemptions (failures were never requeued); give one of the two")

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: str) -> str:
        return v.check_signal(value)

    @model_validator(mode="after")
    def _one_preemption_limit(self) -> PreemptionSpec:
        if self.max_restarts is not None and self.max_preemptions is not None:
            raise SpecIssue("both max_restarts and max_preemptions are set; max_restarts is the old name of "
                            "max_preemptions", path=("preemption", "max_restarts"),
                            hint="keep only max_preemptions")
        return self


class CommsSpec(_Section):
    forward_codec: str = Field("int8", description="MoE all-to-all codec for activations; none = exact")
    backward_codec: str = Field("onebit_ef", description="MoE all-to-all codec for gradients; none = exact")

    @field_validator("forward_codec", "backward_codec")
    @classmethod
    def _codec(cls, value: str) -> str:
        return v.check_codec(value)


class ScheduleSpec(_Section):
    qos_weight: float = Field(0.7, ge=0.0, le=1000.0, description="weight of the QoS score in priorities")
    util_weight: float = Field(0.3, ge=0.0, le=1000.0, description="weight of the utilization score")
    max_inflight_micro: int = Field(1, ge=1, le=4096,
                                    description="micro-batches holding activations at once (1 = strict 1F1B)")

    @model_validator(mode="after")
    def _not_both_zero(self) -> ScheduleSpec:
        if self.qos_weight == 0 and self.util_weight == 0:
            raise SpecIssue("qos_weight and util_weight are both 0; priorities would all be equal",
                            path=("schedule",), hint="set at least one weight above 0 (default 0.7 / 0.3)")
        return self


class JobSpec(_Section):
    """A whole training job, as written in the job YAML."""

    name: str = Field(description=f"job name: {v.JOB_NAME_HELP}")
    workload: str | None = Field(None, description="module.path:Class implementing the workload "
                                                   "(needed when a component runs actions)")
    workload_args: dict[str, Any] = Field(default_factory=dict, description="JSON values passed to the workload")
    components: dict[str, ComponentSpec] = Field(min_length=1, max_length=32,
                                                  description="het components, in het group order")
    training: TrainingSpec | None = Field(None, description="the action loop (needed when a component runs actions)")
    actions: dict[ActionType, ActionOverride] = Field(default_factory=dict)
    slurm: SlurmSpec = Field(default_factory=lambda: SlurmSpec.model_validate({}))
    checkpoint: CheckpointSpec = Field(default_factory=lambda: CheckpointSpec.model_validate({}))
    preemption: PreemptionSpec = Field(default_factory=lambda: PreemptionSpec.model_validate({}))
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for every rank")
    comms: CommsSpec = Field(default_factory=lambda: CommsSpec.model_validate({}))
    schedule: ScheduleSpec = Field(default_factory=lambda: ScheduleSpec.model_validate({}))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return v.check_job_name(value)

    @field_validator("workload")
    @classmethod
    def _workload(cls, value: str | None) -> str | None:
        return None if value is None else v.check_workload_ref(value)

    @field_validator("workload_args")
    @classmethod
    def _workload_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        v.check_json_value(value)
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # the type check reports it
        out: dict[Any, Any] = {}
        for key, val in value.items():
            try:
                v.check_env_name(key)
            except ValueError as exc:
                raise SpecIssue(str(exc), path=("env", str(key))) from None
            try:
                out[key] = v.check_env_value(val)
            except ValueError as exc:
                hint = None if isinstance(val, str) else f'quote it: {key}: "{val}"'
                raise SpecIssue(str(exc), path=("env", key), hint=hint) from None
        return out

    @model_validator(mode="after")
    def _semantics(self) -> JobSpec:
        for cname in self.components:
            if not v.COMPONENT_NAME_RE.fullmatch(cname):
                raise SpecIssue(f"component name {cname!r} is invalid; expected [a-z][a-z0-9_]{{0,31}}",
                                path=("components", cname), hint="use lower-case letters, digits and _")
        self._check_component_kinds()
        owner: dict[str, str] = {}
        for cname, comp in self.components.items():
            for act in comp.actions:
                if act in owner:
                    raise SpecIssue(f"action type {act!r} is listed by both {owner[act]!r} and {cname!r}",
                                    path=("components", cname, "actions"),
                                    hint="each action type runs in exactly one component")
                owner[act] = cname
            _check_placement(cname, comp)
            self._check_min_nodes(cname, comp)
            if comp.spare_nodes and any(c.is_command for c in self.components.values()) \
                    and len(self.components) > 1:
                # The in-allocation restart reruns one srun step (slurm_plugin/render.py); a command
                # component is a step of its own, so such a job has several.
                raise SpecIssue(f"spare_nodes {comp.spare_nodes} on component {cname!r} in a job with a command "
                                f"component and {len(self.components)} components: in-allocation restart is "
                                "supported for a job of action components, or of one command component",
                                path=("components", cname, "spare_nodes"),
                                hint="run the command component as a job of its own with spare_nodes, or remove "
                                     "spare_nodes (preemption.max_failures requeues a failed job)")
            if comp.spare_nodes and self.preemption.max_failures < 1:
                # The in-allocation restart is a retry of a failed attempt: without a failure
                # budget it never runs, and the spares are allocated (and paid for) for nothing.
                raise SpecIssue(f"spare_nodes {comp.spare_nodes} on component {cname!r} with "
                                f"preemption.max_failures {self.preemption.max_failures}: the spares would never "
                                "be used (a restart on them is a retried failure)",
                                path=("components", cname, "spare_nodes"),
                                hint="set preemption.max_failures >= 1, or remove spare_nodes")
            if comp.mem_mb < comp.tasks_per_node:
                raise SpecIssue(f"mem {comp.mem} is less than 1M per task for {comp.tasks_per_node} tasks",
                                path=("components", cname, "mem"))
        limit = self.slurm.time_seconds
        if limit is not None and self.preemption.grace_seconds >= limit:
            raise SpecIssue(f"grace_seconds {self.preemption.grace_seconds} is not shorter than the time limit "
                            f"{self.slurm.time} ({limit} s)", path=("preemption", "grace_seconds"),
                            hint="lower grace_seconds or raise slurm.time")
        if self.training is None:  # command components only: no action loop to check
            return self
        kind = self.training.kind
        missing = [a for a in REQUIRED_ACTIONS[kind] if a not in owner]
        if missing:
            raise SpecIssue(f"training.kind {kind} needs a component running {', '.join(missing)}",
                            path=("components",),
                            hint=f"add {missing[0]!r} to the actions: list of a component")
        if kind == "supervised" and "rollout" in owner:
            raise SpecIssue("rollout actions need training.kind: rl",
                            path=("components", owner["rollout"], "actions"),
                            hint="remove rollout, or set training.kind: rl")
        return self

    def _check_min_nodes(self, cname: str, comp: ComponentSpec) -> None:
        """min_nodes packs a component's ranks onto its surviving nodes after a node death: only
        where the restart runs inside the allocation and the ranks may share a node's cores."""
        if comp.min_nodes is None:
            return
        path = ("components", cname, "min_nodes")
        if comp.min_nodes > comp.nodes:
            raise SpecIssue(f"min_nodes {comp.min_nodes} on component {cname!r} is more than its nodes "
                            f"{comp.nodes}", path=path, hint=f"set min_nodes between 1 and {comp.nodes}")
        if comp.min_nodes == comp.nodes:
            return
        if comp.is_command:
            raise SpecIssue(f"min_nodes {comp.min_nodes} on command component {cname!r}: packing ranks onto "
                            "fewer nodes is supported for action components (a user's program may assume "
                            "its ranks per node)", path=path,
                            hint="remove min_nodes, or give the component spare_nodes instead")
        if comp.gpus_per_node:
            raise SpecIssue(f"min_nodes {comp.min_nodes} on component {cname!r} with gpus_per_node "
                            f"{comp.gpus_per_node}: packed ranks would have no GPUs of their own", path=path,
                            hint="remove min_nodes, or give the component spare_nodes instead")
        if any(c.is_command for c in self.components.values()):
            raise SpecIssue(f"min_nodes {comp.min_nodes} on component {cname!r} in a job with a command "
                            "component: the in-allocation restart reruns one srun step of action components",
                            path=path, hint="remove min_nodes, or run the command component as a job of its own")
        if self.preemption.max_failures < 1:
            raise SpecIssue(f"min_nodes {comp.min_nodes} on component {cname!r} with preemption.max_failures "
                            f"{self.preemption.max_failures}: a restart on fewer nodes is a retried failure",
                            path=path, hint="set preemption.max_failures >= 1, or remove min_nodes")

    def _check_component_kinds(self) -> None:
        """Each component runs actions or a command; workload + training exactly when actions run."""
        for cname, comp in self.components.items():
            if comp.is_command and comp.actions:
                raise SpecIssue(f"component {cname!r} gives both command and actions",
                                path=("components", cname, "actions"),
                                hint="a component runs either hetrun's actions or your own command: remove one")
            if not comp.is_command and not comp.actions:
                raise SpecIssue(f"component {cname!r} has neither actions nor command",
                                path=("components", cname),
                                hint="add actions: [forward, ...] or command: [python3, train.py]")
        has_actions = any(not c.is_command for c in self.components.values())
        for key in ("workload", "training"):
            given = getattr(self, key) is not None
            if has_actions and not given:
                raise SpecIssue(f"missing required key {key!r} (components run actions)", path=(key,),
                                hint=f"add {key}: (see docs/CONTRACTS.md), or give every component a command:")
            if not has_actions and given:
                raise SpecIssue(f"{key} is set but every component runs a command (no actions use it)",
                                path=(key,), hint=f"remove {key}:")
        if not has_actions and self.workload_args:
            raise SpecIssue("workload_args is set but every component runs a command (no workload reads it)",
                            path=("workload_args",), hint="pass arguments in the command instead")

    @property
    def command_components(self) -> list[str]:
        return [name for name, comp in self.components.items() if comp.is_command]

    # -- helpers the planner and the CLI use -------------------------------------------------

    def component_of(self, action_type: str) -> str:
        """The component that runs ``action_type`` (optional types default to optimize's)."""
        for cname, comp in self.components.items():
            if action_type in comp.actions:
                return cname
        if action_type == "optimize":
            raise ValueError("no component runs optimize (a job of command components has no action types)")
        return self.component_of("optimize")

    def to_yaml(self) -> str:
        """The resolved spec (defaults filled, overrides applied) as YAML; loads back equal."""
        data = json.loads(self.model_dump_json())
        # Keys of the other kind of job stay out, so an action job's job.yaml reads as before.
        for key in ("workload", "training"):
            if data[key] is None:
                del data[key]
        if "workload" not in data and not data["workload_args"]:
            del data["workload_args"]
        for comp in data["components"].values():
            if comp["placement"] == "fixed":  # the default: a fixed job's job.yaml reads as before
                for key in ("placement", "partitions", "gpu_types", "node_counts"):
                    del comp[key]
            if comp["command"] is None:
                del comp["command"]
            elif not comp["actions"]:
                del comp["actions"]
        return yaml.dump(data, Dumper=_QuotingDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


class _QuotingDumper(yaml.SafeDumper):
    """Quotes the strings hetrun's loader would read back as floats (``"3e-4"``: YAML 1.2
    reads a plain 3e-4 as a number, PyYAML's dumper writes it plain)."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if EXP_FLOAT_RE.fullmatch(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_QuotingDumper.add_representer(str, _represent_str)


def job_json_schema() -> dict[str, Any]:
    """JSON Schema of the job YAML, for editor completion (``hetrun schema``)."""
    schema = JobSpec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hetrun job spec"
    return schema


def validate_spec_data(data: Any, doc: SourceDoc | None = None,
                       override_paths: dict[tuple[str | int, ...], str] | None = None) -> JobSpec:
    """Validate already-parsed data; errors point at ``doc`` positions or at the override."""
    if not isinstance(data, dict):
        file = doc.file if doc else None
        raise SpecError(f"the document is a {type(data).__name__}; expected a mapping with keys "
                        "name, workload, components, training", file=file, line=1 if file else None)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise translate_validation_error(exc, JobSpec, doc, override_paths or {}) from None
    except RecursionError:
        raise SpecError("the document is nested too deeply", file=doc.file if doc else None) from None


def load_spec(path: str | Path, overrides: Overrides | None = None, *,
              check_args: bool = True) -> JobSpec:
    """Read a job YAML, apply command-line overrides, validate. Raises only ``SpecError``.

    ``check_args`` also validates ``workload_args`` against the workload's typed
    model (``hetrun.dag.workload_args``), importing its light ``_args`` module
    with the YAML's directory on sys.path, as the ranks will.
    """
    doc = read_yaml_file(path)
    data = doc.data
    override_paths: dict[tuple[str | int, ...], str] = {}
    if overrides is not None and not overrides.is_empty():
        if not isinstance(data, dict):
            return validate_spec_data(data, doc)
        data = copy.deepcopy(data)
        override_paths = apply_overrides(data, overrides)
    spec = validate_spec_data(data, doc, override_paths)
    attach_source(spec, doc, override_paths)  # later graph errors point at the YAML too
    if check_args and spec.workload is not None:
        from hetrun.dag.workload_args import check_workload_args

        check_workload_args(spec.workload, spec.workload_args, doc, override_paths,
                            job_dir=Path(doc.file).parent)
    return spec


def spec_from_dict(data: dict[str, Any]) -> JobSpec:
    """Validate a spec built in code (tests, tools); same errors as the loader, without positions."""
    return validate_spec_data(data)

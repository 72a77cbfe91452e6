"""The policy file: typed pydantic models of the pool policy YAML (docs/POLICY.md).

Validation follows the job spec (``hetrun.dag.spec``): strict types,
``extra="forbid"`` with the closest valid key, and errors as ``SpecError``
with file:line:col, key path, bad value and fix (``translate_validation_error``
over a ``SourceDoc``). ``load_policy`` is the one entry point.

Every name in here ends up in a ``sacctmgr`` argument, slurm.conf or the
generated job_submit.lua, so names are checked against Slurm's own name
characters before anything is rendered.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from hetrun.dag import validators as v
from hetrun.dag.spec_errors import SpecIssue, translate_validation_error
from hetrun.dag.yaml_source import SourceDoc, read_yaml_file
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hetrun.errors import SpecError, closest

# sacctmgr lower-cases QOS/account/user names; lower-case only, so the
# policy, the live cluster and the lua table agree without case folding.
NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
NAME_HELP = "lower-case Slurm name: [a-z][a-z0-9_.-], at most 63 characters"
GRES_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
# Kubernetes-style binary suffixes (the issue's `1024Gi`) as well as Slurm's K/M/G/T.
_SIZE_RE = re.compile(r"^([0-9]{1,12})\s*([KMGTkmgt]?)(i?)[Bb]?$")
# Quota keys users write -> Slurm TRES names. `gpu:<type>` maps to gres/gpu:<type>.
TRES_KEYS = {"cpu": "cpu", "mem": "mem", "gpu": "gres/gpu", "node": "node", "shard": "gres/shard"}
_TRES_KEY_RE = re.compile(r"^(cpu|mem|gpu|node|shard)(?::([A-Za-z0-9_.-]{1,32}))?$")

_CONFIG = ConfigDict(extra="forbid", strict=True, validate_default=True)


def size_mb(value: Any) -> int:
    """Megabytes of ``1024Gi`` / ``256G`` / ``512M`` / a bare number of MB. ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"memory {value} must be at least 1 (MB)")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a memory size like 1024Gi or 256G, got {type(value).__name__}")
    m = _SIZE_RE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a memory size; expected a number with Ki/Mi/Gi/Ti or K/M/G/T")
    number, unit = int(m.group(1)), (m.group(2) or "M").upper()
    mb = math.ceil(number * {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[unit] / 1024)
    if mb < 1:
        raise ValueError(f"memory {value!r} is zero")
    return mb


def check_name(value: str) -> str:
    return v.check_pattern(value, NAME_RE, NAME_HELP)


def _check_time(value: Any) -> str:
    text = v.check_time(value)
    if v.time_seconds(text) is None:
        raise ValueError("UNLIMITED is the default; leave the key out instead")
    return text


class _Section(BaseModel):
    model_config = _CONFIG


class Tres(_Section):
    """A TRES amount map (``{gpu: 16, cpu: 64, mem: 256Gi, "gpu:a100": 8}``) -> sacctmgr ``cpu=64,gres/gpu=16``."""

    model_config = ConfigDict(extra="allow", strict=True)

    def check(self, path: tuple[str | int, ...]) -> None:
        """Keys and amounts, checked by the policy with the absolute path (so an error
        points at the bad key's own line and column)."""
        for key, value in (self.model_extra or {}).items():
            if not _TRES_KEY_RE.match(key):
                near = closest(key, list(TRES_KEYS))
                raise SpecIssue(f"TRES key {key!r} is not one of cpu, mem, gpu, node, shard, "
                                "gpu:<type>, shard:<type>", path=(*path, key),
                                hint=f"did you mean {near!r}?" if near else None)
            try:
                if key == "mem":
                    size_mb(value)
                elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"expected a whole number >= 0, got {value!r}")
            except ValueError as exc:
                raise SpecIssue(str(exc), path=(*path, key)) from None

    def as_slurm(self) -> dict[str, int]:
        """``{"cpu": 64, "gres/gpu": 16, "mem": 262144}`` (mem in MB, as sacctmgr stores it)."""
        out: dict[str, int] = {}
        for key, value in (self.model_extra or {}).items():
            base, _, gtype = key.partition(":")
            name = TRES_KEYS[base] + (f":{gtype}" if gtype else "")
            out[name] = size_mb(value) if base == "mem" else int(value)
        return out


class Backfill(_Section):
    """Slurm's backfill scheduler (SchedulerParameters), in the policy's terms."""

    min_reserve_tier: str | None = Field(
        None, description="the lowest tier whose pending jobs get backfill reservations (bf_min_prio_reserve): "
        "jobs of lower tiers never hold nodes idle for themselves, they start wherever they fit now")
    busy_nodes: bool = Field(False, description="bf_busy_nodes: reservations prefer nodes in use, "
                             "so idle ones stay free for jobs that can start now")


# The QOS of a tier's jobs that checkpoint (``scheduling.checkpointed``): ``<tier>_ckpt``.
CKPT_SUFFIX = "_ckpt"


class Checkpointed(_Section):
    """Preemption by work lost, through Slurm alone: each tier gets a second QOS
    ``<tier>_ckpt`` for jobs that checkpoint and stop at an agreed step on SIGTERM
    (hetrun jobs, scripts using the run API). Its Priority sits just below the tier's,
    so preempt/qos, which picks candidates in rising QOS priority, takes them before
    the tier's plain jobs (which lose all their work). Without ``grace_time`` a preempted
    job has slurm.conf's KillWait between SIGTERM and SIGKILL (30 s as hetrun renders it;
    the run API stops within 20 s of SIGTERM), and the preemptor starts as soon as it exits.
    A QOS GraceTime, measured on Slurm 22.05.8, held the preemptor ~41 s even when the job
    exited at once (docs/POLICY.md): set it only for jobs whose stop needs more than KillWait."""

    grace_time: int | None = Field(None, ge=1, le=3600, description="GraceTime (s) of the <tier>_ckpt QOS "
                                   "(default none: KillWait alone); see docs/POLICY.md before setting it")
    # Why a switch and not the default: sparing plain jobs moves the cost of a higher tier's start
    # from the killed jobs' lost work to the higher tier's wait (until plain jobs end on their own);
    # a site whose top tier must start at once keeps preempting them, cheapest first.
    spare_plain: bool = Field(False, description="a tier preempts only the lower tiers' <tier>_ckpt jobs "
                              "(which stop at an agreed step and lose ~0): jobs that would lose all their work "
                              "run to their end, and a higher tier waits for them at the head of the queue")


class Scheduling(_Section):
    priority: list[str] = Field(min_length=1, max_length=16,
                                description="tiers, highest first; each becomes a Slurm QOS")
    preemption: bool = Field(False, description="a tier preempts (requeues) jobs of every tier below it")
    default: str | None = Field(None, description="tier of jobs that name none (default: the lowest)")
    backfill: Backfill | None = None
    checkpointed: Checkpointed | None = Field(
        None, description="a <tier>_ckpt QOS per tier: checkpointing jobs are preempted first, with a grace time")

    @field_validator("priority")
    @classmethod
    def _tiers(cls, value: list[str]) -> list[str]:
        for name in value:
            check_name(name)
        dupes = sorted({t for t in value if value.count(t) > 1})
        if dupes:
            raise ValueError(f"tiers listed twice: {', '.join(dupes)}")
        return value


class Sharing(_Section):
    shards_per_gpu: int = Field(ge=2, le=128, description="GRES shards per GPU (several small jobs on one GPU)")


class GpuResources(_Section):
    type: list[str] = Field(default_factory=list, description="GRES types (gpu:<type>)")
    count: int = Field(ge=0, le=1_000_000, description="GPUs in the pool")
    scheduling: Scheduling | None = None
    sharing: Sharing | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _types(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        for item in value if isinstance(value, list) else []:
            if isinstance(item, str):
                v.check_pattern(item, GRES_TYPE_RE, "GRES type ([A-Za-z0-9_.-], at most 32)")
        return value


class CpuResources(_Section):
    cores: int = Field(ge=1, le=10_000_000, description="CPU cores in the pool")
    memory: str | int | None = Field(None, description="memory in the pool (1024Gi, 4T...)")
    isolation: Literal["numa-aware", "cores", "none"] = Field(
        "none", description="numa-aware: cgroup confinement + binding to NUMA domains; cores: cgroups only")

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is not None:
            size_mb(value)
        return value


class Resources(_Section):
    gpu: GpuResources | None = None
    cpu: CpuResources | None = None


class TierLimits(_Section):
    """Extra limits of one tier's QOS."""

    priority: int | None = Field(None, ge=0, le=2**32 - 2, description="QOS Priority (default: spaced by rank)")
    max_wall: str | int | None = Field(None, description="MaxWall of a job in this tier")
    grp_tres: Tres | None = Field(None, description="GrpTRES: all jobs of the tier together")
    max_tres_per_user: Tres | None = Field(None, description="MaxTRESPerUser")

    @field_validator("max_wall", mode="before")
    @classmethod
    def _wall(cls, value: Any) -> Any:
        return None if value is None else _check_time(value)


class Account(_Section):
    """A team: a Slurm account with its association limits."""

    fairshare: int = Field(1, ge=1, le=1_000_000, description="Fairshare (shares)")
    quota: Tres | None = Field(None, description="GrpTRES: everything the team runs at once")
    max_per_user: Tres | None = Field(None, description="cap per listed user in this account "
                                      "(GrpTRES of the user's association)")
    max_wall: str | int | None = None
    tiers: list[str] | None = Field(None, description="tiers (QOS) the team may use; default: all")
    users: list[str] = Field(default_factory=list)
    parent: str | None = Field(None, description="parent account (default: root)")

    @field_validator("max_wall", mode="before")
    @classmethod
    def _wall(cls, value: Any) -> Any:
        return None if value is None else _check_time(value)

    @field_validator("users")
    @classmethod
    def _users(cls, value: list[str]) -> list[str]:
        for name in value:
            check_name(name)
        return value

    @field_validator("parent")
    @classmethod
    def _parent(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value)


class TimeSlicing(_Section):
    """Gang scheduling of short jobs on one partition (OverSubscribe=FORCE:N)."""

    partition: str = Field(description="partition whose nodes short jobs share by time slicing")
    max_wall: str | int = Field(description="jobs at most this long without a partition go there")
    jobs_per_core: int = Field(2, ge=2, le=32, description="OverSubscribe=FORCE:<n>")
    slice_seconds: int = Field(30, ge=5, le=86_400, description="SchedulerTimeSlice")

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str) -> str:
        return v.check_pattern(value, v.SLURM_NAME_RE, "partition name")

    @field_validator("max_wall", mode="before")
    @classmethod
    def _wall(cls, value: Any) -> Any:
        return _check_time(value)


class Power(_Section):
    idle_after: str | int = Field(description="SuspendTime: power a node down after it idled this long")
    suspend_program: str = Field(description="absolute path of the site's power-down script")
    resume_program: str = Field(description="absolute path of the site's power-up script")

    @field_validator("idle_after", mode="before")
    @classmethod
    def _idle(cls, value: Any) -> Any:
        return _check_time(value)

    @field_validator("suspend_program", "resume_program")
    @classmethod
    def _program(cls, value: str) -> str:
        v.check_plain_string(value, "program")
        if not value.startswith("/") or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} must be an absolute path without spaces (slurm.conf cannot quote it)")
        return value


class PriorityWeights(_Section):
    qos: int = Field(10_000, ge=0, le=2**32 - 1)
    fairshare: int = Field(1_000, ge=0, le=2**32 - 1)
    age: int = Field(100, ge=0, le=2**32 - 1)
    job_size: int = Field(0, ge=0, le=2**32 - 1)


class Naming(_Section):
    qos_prefix: str = Field("", description="prefix of every QOS the policy creates (e.g. pool_)")

    @field_validator("qos_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if value and not re.match(r"^[a-z][a-z0-9_.-]{0,31}$", value):
            raise ValueError(f"{value!r} is not a QOS name prefix ([a-z][a-z0-9_.-], at most 32)")
        return value


class PolicySpec(_Section):
    """A whole pool policy."""

    resources: Resources
    tiers: dict[str, TierLimits] = Field(default_factory=dict)
    accounts: dict[str, Account] = Field(default_factory=dict)
    time_slicing: TimeSlicing | None = None
    power: Power | None = None
    priority_weights: PriorityWeights = Field(default_factory=lambda: PriorityWeights.model_validate({}))
    naming: Naming = Field(default_factory=lambda: Naming.model_validate({}))

    @model_validator(mode="after")
    def _semantics(self) -> PolicySpec:
        self._check_tres()
        names = self.tier_names
        if (self.tiers or any(a.tiers for a in self.accounts.values())) and not names:
            raise SpecIssue("tiers are used but resources.gpu.scheduling.priority lists none",
                            path=("resources",), hint="add resources.gpu.scheduling.priority: [high, normal]")
        for tier in self.tiers:
            self._known_tier(tier, ("tiers", tier))
        sched = self.resources.gpu.scheduling if self.resources.gpu else None
        if sched and sched.default is not None:
            self._known_tier(sched.default, ("resources", "gpu", "scheduling", "default"))
        if sched and sched.checkpointed is not None:
            self._check_checkpointed(sched)
        if sched and sched.backfill and sched.backfill.min_reserve_tier is not None:
            self._known_tier(sched.backfill.min_reserve_tier,
                             ("resources", "gpu", "scheduling", "backfill", "min_reserve_tier"))
        for aname, acct in self.accounts.items():
            if not NAME_RE.match(aname):
                raise SpecIssue(f"account name {aname!r} is not a {NAME_HELP}", path=("accounts", aname))
            for i, tier in enumerate(acct.tiers or []):
                self._known_tier(tier, ("accounts", aname, "tiers", i))
            if acct.parent is not None and acct.parent not in self.accounts and acct.parent != "root":
                raise SpecIssue(f"parent {acct.parent!r} is not an account of this policy",
                                path=("accounts", aname, "parent"),
                                hint=f"one of: root, {', '.join(self.accounts)}")
        self._check_gpu_types()
        return self

    def _check_tres(self) -> None:
        for tname, limits in self.tiers.items():
            for fname in ("grp_tres", "max_tres_per_user"):
                if getattr(limits, fname) is not None:
                    getattr(limits, fname).check(("tiers", tname, fname))
        for aname, acct in self.accounts.items():
            for fname in ("quota", "max_per_user"):
                if getattr(acct, fname) is not None:
                    getattr(acct, fname).check(("accounts", aname, fname))

    def _check_checkpointed(self, sched: Scheduling) -> None:
        path = ("resources", "gpu", "scheduling", "checkpointed")
        if not sched.preemption:
            raise SpecIssue("checkpointed orders preemption, but preemption is off", path=path,
                            hint="set resources.gpu.scheduling.preemption: true, or remove checkpointed")
        for i, tier in enumerate(sched.priority):
            if tier.endswith(CKPT_SUFFIX) or f"{tier}{CKPT_SUFFIX}" in sched.priority:
                raise SpecIssue(f"tier {tier!r} clashes with the {CKPT_SUFFIX} QOS that checkpointed adds",
                                path=("resources", "gpu", "scheduling", "priority", i),
                                hint=f"rename the tier so no name ends in {CKPT_SUFFIX}")

    def _known_tier(self, tier: str, path: tuple[str | int, ...]) -> None:
        if tier not in self.tier_names:
            near = closest(tier, self.tier_names)
            raise SpecIssue(f"tier {tier!r} is not in resources.gpu.scheduling.priority "
                            f"({', '.join(self.tier_names) or 'none'})", path=path,
                            hint=f"did you mean {near!r}?" if near else "add it to the priority list")

    def _check_gpu_types(self) -> None:
        # GRES types compare case-insensitively (TRES names are lower-case).
        types = {t.lower() for t in self.resources.gpu.type} if self.resources.gpu else set()
        for aname, acct in self.accounts.items():
            for field_name in ("quota", "max_per_user"):
                tres = getattr(acct, field_name)
                for key in (tres.model_extra or {}) if tres else {}:
                    base, _, gtype = key.partition(":")
                    if base == "gpu" and gtype and gtype.lower() not in types:
                        raise SpecIssue(f"GPU type {gtype!r} is not in resources.gpu.type",
                                        path=("accounts", aname, field_name, key),
                                        hint=f"one of: {', '.join(sorted(types)) or 'none listed'}")

    # -- derived names ---------------------------------------------------------------

    @property
    def tier_names(self) -> list[str]:
        gpu = self.resources.gpu
        return list(gpu.scheduling.priority) if gpu and gpu.scheduling else []

    def qos_name(self, tier: str) -> str:
        return self.naming.qos_prefix + tier

    @property
    def default_tier(self) -> str | None:
        gpu = self.resources.gpu
        if not gpu or not gpu.scheduling:
            return None
        return gpu.scheduling.default or gpu.scheduling.priority[-1]

    @property
    def checkpointed(self) -> Checkpointed | None:
        gpu = self.resources.gpu
        return gpu.scheduling.checkpointed if gpu and gpu.scheduling else None

    def ckpt_qos_name(self, tier: str) -> str:
        """The QOS of ``tier``'s checkpointing jobs (``scheduling.checkpointed``)."""
        return self.qos_name(tier + CKPT_SUFFIX)

    @property
    def preemption(self) -> bool:
        gpu = self.resources.gpu
        return bool(gpu and gpu.scheduling and gpu.scheduling.preemption)


def validate_policy_data(data: Any, doc: SourceDoc | None = None) -> PolicySpec:
    if not isinstance(data, dict):
        raise SpecError(f"the document is a {type(data).__name__}; expected a mapping with resources:",
                        file=doc.file if doc else None, line=1 if doc else None)
    try:
        return PolicySpec.model_validate(data)
    except ValidationError as exc:
        raise translate_validation_error(exc, PolicySpec, doc, {}) from None


def load_policy(path: str | Path) -> PolicySpec:
    """Read and validate a policy YAML. Raises only ``SpecError``."""
    doc = read_yaml_file(path)
    return validate_policy_data(doc.data, doc)

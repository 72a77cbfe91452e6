"""``plan.json``'s typed view: the one model every reader of a run's plan goes through.

Standard library only (like ``hetrun.errors``), so every layer reads it: the
per-rank runtime (``hetrun.runtime.plan_view.load_plan`` adds the planner's
re-validation), the batch script's post-mortem, ``hetrun resume``, the local
backend, the reports and the CLI. ``dag/plan.py`` (pydantic) writes the file and
is its schema; this module reads the JSON contract (docs/CONTRACTS.md), and
the ``checkpoint`` / ``preemption`` sections carry the job file's own defaults
(``hetrun.rundir.DEFAULTS``), so no reader repeats one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hetrun import rundir
from hetrun.errors import RunDirError
from hetrun.rundir import DEFAULTS, PLAN_JSON, checkpoint_root


class _Section(Mapping[str, Any]):
    """A typed plan section that still reads as the JSON object it came from: ``raw`` keeps
    every key (those another module owns too: ``checkpoint.object_store``, ``memory_every``),
    ``section["keep"]`` / ``.get("keep")`` give the typed value, default applied."""

    raw: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        if key in self._typed():
            return getattr(self, key)
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._typed(), *self.raw]))

    def __len__(self) -> int:
        return len(set(self._typed()) | set(self.raw))

    @classmethod
    def _typed(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "raw")  # type: ignore[arg-type]


def _int(raw: Mapping[str, Any], key: str, default: int | None, where: str, path: Path) -> int | None:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise RunDirError(f"{path}: {where}.{key}: {value!r} is not an integer",
                          hint="regenerate it with `hetrun plan` / `hetrun submit`")
    return int(value)


@dataclass(frozen=True, eq=False)
class CheckpointSection(_Section):
    interval: int = DEFAULTS.checkpoint_interval
    directory: str | None = None
    keep: int = DEFAULTS.checkpoint_keep
    max_delta_chain: int = DEFAULTS.max_delta_chain
    optimizer_encoding: str = DEFAULTS.optimizer_encoding
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], path: Path) -> CheckpointSection:
        w = "checkpoint"
        return cls(interval=_int(raw, "interval", DEFAULTS.checkpoint_interval, w, path) or 0,
                   directory=str(raw["directory"]) if raw.get("directory") else None,
                   keep=_int(raw, "keep", DEFAULTS.checkpoint_keep, w, path) or DEFAULTS.checkpoint_keep,
                   max_delta_chain=_int(raw, "max_delta_chain", DEFAULTS.max_delta_chain, w, path)
                   or DEFAULTS.max_delta_chain,
                   optimizer_encoding=str(raw.get("optimizer_encoding") or DEFAULTS.optimizer_encoding),
                   raw=dict(raw))

    def due(self, iteration: int) -> bool:
        """Whether the state after ``iteration`` is checkpointed (``hetrun.rundir.runs_at``)."""
        return rundir.runs_at(self.interval, iteration)


@dataclass(frozen=True, eq=False)
class PreemptionSection(_Section):
    signal: str = DEFAULTS.preemption_signal
    grace_seconds: int = DEFAULTS.grace_seconds
    max_preemptions: int | None = None  # None: unlimited
    max_failures: int = DEFAULTS.max_failures
    max_restarts: int | None = None  # the old name of max_preemptions (old plans)
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], path: Path) -> PreemptionSection:
        w = "preemption"
        return cls(signal=str(raw.get("signal") or DEFAULTS.preemption_signal),
                   grace_seconds=_int(raw, "grace_seconds", DEFAULTS.grace_seconds, w, path) or DEFAULTS.grace_seconds,
                   max_preemptions=_int(raw, "max_preemptions", None, w, path),
                   max_failures=_int(raw, "max_failures", DEFAULTS.max_failures, w, path) or 0,
                   max_restarts=_int(raw, "max_restarts", None, w, path),
                   raw=dict(raw))


@dataclass(frozen=True)
class Dep:
    id: str
    lag: int = 0


@dataclass(frozen=True)
class ActionSpec:
    id: str
    type: str
    component: str
    micro: int | None = None
    deps: tuple[Dep, ...] = ()
    tolerance_window: int = 0
    qos: str = "normal"
    priority: float = 0.0
    fused: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def every(self) -> int:
        return max(1, int(self.extra.get("every", 1) or 1))

    def runs_at(self, iteration: int) -> bool:
        """The planner's rule (``hetrun.rundir.runs_at``)."""
        return rundir.runs_at(self.every, iteration)

    def last_run_at_or_before(self, iteration: int) -> int:
        """The newest iteration <= ``iteration`` this action runs at (-1: none)."""
        return rundir.last_run_at_or_before(self.every, iteration)


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    index: int
    ntasks: int
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    mem_mb: int = 0
    actions: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None  # a command component's argv; None: it runs actions

    @property
    def runs_actions(self) -> bool:
        return self.command is None


@dataclass(frozen=True)
class PlanView:
    path: Path
    name: str
    workload: str
    workload_args: dict[str, Any]
    training: dict[str, Any]
    components: tuple[ComponentSpec, ...]
    actions: tuple[ActionSpec, ...]
    order: tuple[str, ...]
    checkpoint: CheckpointSection
    preemption: PreemptionSection
    env: dict[str, str]
    comms: dict[str, Any]
    raw: dict[str, Any]

    @property
    def iterations(self) -> int:
        return int(self.training.get("iterations", 0))

    @property
    def pipeline_window(self) -> int:
        return int(self.training.get("pipeline_window", 0))

    @property
    def micro_batches(self) -> int:
        return int(self.training.get("micro_batches", 1))

    @property
    def seed(self) -> int:
        return int(self.training.get("seed", 0))

    @property
    def mode(self) -> str:
        """``pipelined`` (default) or ``coarse`` (the synchronous loop)."""
        return str(self.training.get("mode", "pipelined"))

    @property
    def kind(self) -> str:
        return str(self.training.get("kind", "rl"))

    @property
    def job_dir(self) -> str | None:
        """Where the job YAML was (script mode: where `hetrun submit` ran); None in old plans."""
        value = self.raw.get("job_dir")
        return str(value) if value else None

    def checkpoint_root(self, run_dir: str | os.PathLike[str]) -> Path:
        return checkpoint_root(run_dir, self.checkpoint.directory)

    @property
    def action_components(self) -> tuple[ComponentSpec, ...]:
        """The components the action runtime runs, in plan order: one MPI world of their
        ranks (a mixed job's command components are separate job steps)."""
        return tuple(c for c in self.components if c.runs_actions)

    def first_rank(self, name: str) -> int:
        """The first rank of ``name`` in hetrun's numbering, what events carry: the action
        components' ranks first, as their MPI world numbers them, then each command
        component's, in plan order (the same as plan order when commands come last)."""
        ordered = [*self.action_components, *(c for c in self.components if not c.runs_actions)]
        names = [c.name for c in ordered]
        self.component(name)  # an unknown name: the error that lists the components
        return sum(c.ntasks for c in ordered[:names.index(name)])

    def component(self, name: str) -> ComponentSpec:
        for comp in self.components:
            if comp.name == name:
                return comp
        names = ", ".join(c.name for c in self.components)
        raise RunDirError(f"{self.path}: no component {name!r} in the plan (components: {names})")

    def action(self, action_id: str) -> ActionSpec:
        for act in self.actions:
            if act.id == action_id:
                return act
        raise RunDirError(f"{self.path}: no action {action_id!r} in the plan")

    def actions_of(self, component: str) -> list[ActionSpec]:
        """This component's actions of the per-iteration template, in plan order."""
        rank = {aid: i for i, aid in enumerate(self.order)}
        mine = [a for a in self.actions if a.component == component]
        return sorted(mine, key=lambda a: (rank.get(a.id, len(rank)), -a.priority))

    @property
    def total_tasks(self) -> int:
        return sum(c.ntasks for c in self.components)


def read_plan(run_dir: str | os.PathLike[str], *,
              validate: Callable[[str, Path], None] | None = None) -> PlanView:
    """Read and check ``<run_dir>/plan.json``; raise RunDirError naming what is wrong.
    ``validate(text, path)``: a further check of the text (the runtime passes the planner's)."""
    path = Path(run_dir) / PLAN_JSON
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise RunDirError(
            f"{path} does not exist",
            hint="pass the run directory that `hetrun submit` created (it holds plan.json)",
        ) from exc
    except OSError as exc:
        raise RunDirError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(
            f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})",
            hint="regenerate it with `hetrun plan` / `hetrun submit`",
        ) from exc
    if validate is not None:
        validate(text, path)
    return plan_from_dict(raw, path)


def _req(obj: dict[str, Any], key: str, where: str, path: Path) -> Any:
    if key not in obj:
        raise RunDirError(f"{path}: {where}: missing key {key!r}")
    return obj[key]


_ACTION_KEYS = {"id", "type", "component", "micro", "deps", "tolerance_window", "qos", "priority", "fused"}


def _components(raw: list[Any], path: Path) -> list[ComponentSpec]:
    comps = []
    for i, c in enumerate(raw):
        where = f"components[{i}]"
        tasks_per_node = int(c.get("tasks_per_node", 1))
        nodes = int(c.get("nodes", 1))
        comps.append(
            ComponentSpec(
                name=str(_req(c, "name", where, path)),
                index=int(c.get("index", i)),
                ntasks=int(c.get("ntasks", nodes * tasks_per_node)),
                nodes=nodes,
                tasks_per_node=tasks_per_node,
                cpus_per_task=int(c.get("cpus_per_task", 1)),
                gpus_per_node=int(c.get("gpus_per_node", 0)),
                mem_mb=int(c.get("mem_mb", 0)),
                actions=tuple(c.get("actions", ())),
                command=None if c.get("command") is None else tuple(str(w) for w in c["command"]),
            )
        )
    return sorted(comps, key=lambda c: c.index)


def _action(a: dict[str, Any], where: str, names: set[str], path: Path) -> ActionSpec:
    comp = str(_req(a, "component", where, path))
    if comp not in names:
        raise RunDirError(f"{path}: {where}: component {comp!r} is not one of {sorted(names)}")
    deps = [Dep(d, 0) if isinstance(d, str) else Dep(str(d["id"]), int(d.get("lag", 0)))
            for d in a.get("deps", [])]
    micro = a.get("micro")
    return ActionSpec(
        id=str(_req(a, "id", where, path)),
        type=str(_req(a, "type", where, path)),
        component=comp,
        micro=None if micro is None else int(micro),
        deps=tuple(deps),
        tolerance_window=int(a.get("tolerance_window", 0) or 0),
        qos=str(a.get("qos", "normal")),
        priority=float(a.get("priority", 0.0) or 0.0),
        fused=tuple(str(x) for x in a.get("fused", []) or []),
        extra={k: v for k, v in a.items() if k not in _ACTION_KEYS},
    )


def _actions(raw: list[Any], names: set[str], path: Path) -> list[ActionSpec]:
    actions = [_action(a, f"actions[{i}]", names, path) for i, a in enumerate(raw)]
    ids = {a.id for a in actions}
    for a in actions:
        for d in a.deps:
            if d.id not in ids:
                raise RunDirError(f"{path}: action {a.id!r} depends on unknown action {d.id!r}")
    return actions


def _section(raw: Mapping[str, Any], key: str, path: Path) -> Mapping[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise RunDirError(f"{path}: {key}: expected an object, got {type(value).__name__}")
    return value


def plan_from_dict(raw: Any, path: Path | str = PLAN_JSON) -> PlanView:
    """Build a PlanView from the parsed JSON (also used by tests that write plans)."""
    path = Path(path)
    if not isinstance(raw, dict):
        raise RunDirError(f"{path}: top level must be a JSON object, got {type(raw).__name__}")
    version = raw.get("version", 1)
    if version != 1:
        raise RunDirError(
            f"{path}: plan version {version!r} is not supported (this runtime reads version 1)",
            hint="re-plan the job with this hetrun version",
        )
    comps = _components(_req(raw, "components", "plan", path), path)
    actions = _actions(raw.get("actions", []), {c.name for c in comps}, path)
    order = tuple(raw.get("order") or [a.id for a in actions])
    return PlanView(
        path=path,
        name=str(raw.get("name", "")),
        workload=str(raw.get("workload") or ""),
        workload_args=dict(raw.get("workload_args") or {}),
        training=dict(raw.get("training") or {}),
        components=tuple(comps),
        actions=tuple(actions),
        order=order,
        checkpoint=CheckpointSection.from_json(_section(raw, "checkpoint", path), path),
        preemption=PreemptionSection.from_json(_section(raw, "preemption", path), path),
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        comms=dict(raw.get("comms") or {}),
        raw=raw,
    )

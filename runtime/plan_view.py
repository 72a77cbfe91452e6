"""The runtime's typed view of ``plan.json`` (shape fixed in docs/CONTRACTS.md).

The runtime reads the JSON contract, not the planner's in-memory classes, so
a rank never needs more of ``hetrun.dag`` than the errors. When the planner's
``Plan.from_json`` is importable it is used first to validate the file, so a
plan the planner would reject is rejected here with the planner's message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrun.errors import RunDirError

PLAN_FILE = "plan.json"
DEFAULT_CHECKPOINT_DIR = "ckpt"  # the store's place when the job sets no checkpoint.directory


def checkpoint_root(run_dir: str | os.PathLike[str], directory: str | None) -> Path:
    """Where a run's checkpoint store lives: ``checkpoint.directory`` (a relative one is
    relative to the run directory), else ``<run_dir>/ckpt``. One component's store is
    ``checkpoint_root(...) / component``. Every reader and writer resolves it here."""
    root = Path(directory) if directory else Path(DEFAULT_CHECKPOINT_DIR)
    return root if root.is_absolute() else Path(run_dir) / root


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
        """The planner's rule: runs on iterations i with (i + 1) % every == 0."""
        return (iteration + 1) % self.every == 0

    def last_run_at_or_before(self, iteration: int) -> int:
        """The newest iteration <= ``iteration`` this action runs at (-1: none)."""
        if iteration < 0:
            return -1
        return ((iteration + 1) // self.every) * self.every - 1


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
    checkpoint: dict[str, Any]
    preemption: dict[str, Any]
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
        return checkpoint_root(run_dir, (self.checkpoint or {}).get("directory"))

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


def load_plan(run_dir: str | os.PathLike[str], *, validate: bool = True) -> PlanView:
    """Read and check ``<run_dir>/plan.json``; raise RunDirError naming what is wrong.

    ``validate=False`` skips the planner's re-validation (it imports pydantic
    and the spec models: ~0.3 s per rank), for a plan already validated by an
    earlier attempt of the same run.
    """
    path = Path(run_dir) / PLAN_FILE
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
    if validate:
        _validate_with_planner(text, path)
    return plan_from_dict(raw, path)


def _validate_with_planner(text: str, path: Path) -> None:
    try:
        from hetrun.dag.plan import Plan  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    from_json = getattr(Plan, "from_json", None)
    if from_json is None:
        return
    try:
        try:
            from_json(text, source=str(path))
        except TypeError:  # a planner without the source argument
            from_json(text)
    except RunDirError:
        raise
    except Exception as exc:
        raise RunDirError(f"{path}: the planner rejects this plan: {exc}") from exc


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


def plan_from_dict(raw: Any, path: Path | str = PLAN_FILE) -> PlanView:
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
        checkpoint=dict(raw.get("checkpoint") or {}),
        preemption=dict(raw.get("preemption") or {}),
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        comms=dict(raw.get("comms") or {}),
        raw=raw,
    )

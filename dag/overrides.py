"""Command-line overrides of a job spec, typed the way sbatch users already type them.

``-p/-t/-A/-q/--constraint`` map to the ``slurm`` section, ``-N 2`` to the first
component's nodes (``-N rollout=3`` to a named one), ``--gres gpu:2`` to the
first GPU component (``--gres learner=gpu:2``), and ``--set key.path=value``
to any key (value parsed as YAML). Overrides are applied to the raw data before
validation, so they get exactly the same checks as the file; ``apply_overrides``
returns which key paths each override touched so errors can name it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hetrun.dag.yaml_source import KeyPath, parse_yaml_text

from hetrun.errors import SpecError, closest

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GRES_RE = re.compile(r"^gpu:([0-9]{1,3})$")


@dataclass
class Overrides:
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    nodes: list[str] = field(default_factory=list)
    gres: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.partition or self.time or self.account or self.qos or self.constraint
                    or self.nodes or self.gres or self.sets)


def _fail(label: str, message: str, hint: str | None = None, key_path: str | None = None) -> SpecError:
    return SpecError(message, file=f"override {label}", key_path=key_path, hint=hint)


def _components(data: dict[str, Any], label: str) -> dict[str, Any]:
    comps = data.get("components")
    if not isinstance(comps, dict) or not comps:
        raise _fail(label, "the job spec has no components to apply this to",
                    hint="define components: in the job YAML first")
    return comps


def _component_named(data: dict[str, Any], name: str, label: str) -> dict[str, Any]:
    comps = _components(data, label)
    if name not in comps:
        near = closest(name, [str(k) for k in comps])
        raise _fail(label, f"no component named {name!r}; components: {', '.join(map(str, comps))}",
                    hint=f"did you mean {near!r}?" if near else None)
    comp = comps[name]
    if not isinstance(comp, dict):
        raise _fail(label, f"component {name!r} is not a mapping in the job YAML")
    return comp


def _split_target(value: str) -> tuple[str | None, str]:
    """``rollout=3`` -> ('rollout', '3'); ``3`` -> (None, '3')."""
    if "=" in value:
        name, _, rest = value.partition("=")
        return name.strip(), rest.strip()
    return None, value.strip()


def _parse_count(text: str, label: str, what: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", text):
        raise _fail(label, f"{what} {text!r} is not a whole number", hint=f"e.g. {label.split()[0]} 2")
    return int(text)


def _set_path(data: dict[str, Any], path: list[str], value: Any, label: str) -> KeyPath:
    """Set ``path`` to ``value``; returns the shortest path this created or replaced, so
    errors about anything under a mapping the override made are blamed on it."""
    node: Any = data
    created: KeyPath | None = None
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
            created = created or tuple(path[: i + 1])
        if not isinstance(child, dict):
            raise _fail(label, f"{'.'.join(path[: i + 1])} is a {type(child).__name__}, not a mapping; "
                        f"cannot set {'.'.join(path)}")
        node = child
    node[path[-1]] = value
    return created or tuple(path)


def apply_overrides(data: dict[str, Any], overrides: Overrides) -> dict[KeyPath, str]:
    """Apply ``overrides`` to ``data`` in place; returns key path -> override label."""
    touched: dict[KeyPath, str] = {}

    def set_slurm(key: str, value: str | None, flag: str) -> None:
        if value is None:
            return
        slurm = data.setdefault("slurm", {})
        if slurm is None:
            slurm = data["slurm"] = {}
        if not isinstance(slurm, dict):
            raise _fail(f"{flag} {value}", "slurm: in the job YAML is not a mapping")
        slurm[key] = value
        touched[("slurm", key)] = f"{flag} {value}"

    set_slurm("partition", overrides.partition, "--partition")
    set_slurm("time", overrides.time, "--time")
    set_slurm("account", overrides.account, "--account")
    set_slurm("qos", overrides.qos, "--qos")
    set_slurm("constraint", overrides.constraint, "--constraint")

    for item in overrides.nodes:
        label = f"-N {item}"
        name, count_text = _split_target(item)
        count = _parse_count(count_text, label, "node count")
        if name is None:
            name = str(next(iter(_components(data, label))))
        _component_named(data, name, label)["nodes"] = count
        touched[("components", name, "nodes")] = label

    for item in overrides.gres:
        label = f"--gres {item}"
        name, spec = _split_target(item)
        m = _GRES_RE.match(spec)
        if not m:
            raise _fail(label, f"gres {spec!r} is not gpu:N", hint="e.g. --gres gpu:2 or --gres learner=gpu:2")
        if name is None:
            name = _first_gpu_component(data, label)
        _component_named(data, name, label)["gpus_per_node"] = int(m.group(1))
        touched[("components", name, "gpus_per_node")] = label

    for item in overrides.sets:
        label = f"--set {item}"
        key, sep, raw = item.partition("=")
        if not sep:
            raise _fail(label, "expected key.path=value", hint="e.g. --set training.iterations=100")
        parts = key.strip().split(".")
        bad = next((p for p in parts if not _KEY_RE.match(p)), None)
        if bad is not None:
            raise _fail(label, f"key path {key!r} has an invalid part {bad!r}",
                        hint="dotted keys of letters, digits and _, e.g. components.learner.nodes")
        if parts[0] == "components" and len(parts) > 2:
            _component_named(data, parts[1], label)  # a typo here would create a component
        value = None if raw.strip() == "" else _parse_value(raw, label)
        touched[_set_path(data, parts, value, label)] = label
    return touched


def _parse_value(raw: str, label: str) -> Any:
    try:
        return parse_yaml_text(raw, file=f"override {label}").data
    except SpecError as exc:
        raise _fail(label, f"cannot read the value {raw!r} as YAML: {exc.message}") from None


def _first_gpu_component(data: dict[str, Any], label: str) -> str:
    comps = _components(data, label)
    for name, comp in comps.items():
        if isinstance(comp, dict) and isinstance(comp.get("gpus_per_node"), int) and comp["gpus_per_node"] > 0:
            return str(name)
    # No component asks for GPUs yet: the learner (the one running forward) is the natural target.
    for name, comp in comps.items():
        if isinstance(comp, dict) and isinstance(comp.get("actions"), list) and "forward" in comp["actions"]:
            return str(name)
    raise _fail(label, "no component has GPUs or runs forward; name the component",
                hint=f"--gres {next(iter(comps))}=gpu:N")

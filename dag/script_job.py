"""Script mode: a program instead of a job YAML (``hetrun submit train.py -N 2 -- --lr 3e-4``).

Like ``sbatch --wrap`` or ``torchx run dist.ddp``: the program becomes the one
command component (``main``) of a job with no actions; the sbatch-style flags
and ``--set`` apply to that spec as they would to a YAML one, and the spec made
is what ``hetrun submit`` writes to the run directory as ``job.yaml``.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from pathlib import Path

from hetrun.dag.overrides import Overrides, apply_overrides
from hetrun.dag.spec import JobSpec, validate_spec_data

from hetrun.errors import SpecError

SCRIPT_COMPONENT = "main"
YAML_SUFFIXES = (".yaml", ".yml")


def is_script(path: str | os.PathLike[str]) -> bool:
    """A job file that is a program, not a job YAML: a ``.py`` file, or any other
    executable regular file that is not ``.yaml``/``.yml``."""
    p = Path(path)
    if p.suffix.lower() in YAML_SUFFIXES:
        return False
    return p.suffix == ".py" or (p.is_file() and os.access(p, os.X_OK))


def _job_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip(".-")[:64]
    return name or "script"


def script_spec(path: str | os.PathLike[str], args: Sequence[str], *, python: str,
                tasks_per_node: int | None = None, overrides: Overrides | None = None) -> JobSpec:
    """The one-component command job that runs ``path`` with ``args`` on every rank.

    A ``.py`` file runs under ``python`` (the interpreter hetrun runs in), anything
    else is executed directly; the path is made absolute so ranks find it from
    any working directory. Raises ``SpecError`` naming the flag that is wrong.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError(f"{p}: no such file", hint="pass a job YAML, a .py script or an executable")
    full = str(p.resolve())
    if p.suffix != ".py" and not os.access(full, os.X_OK):
        raise SpecError(f"{p} is neither a job YAML (.yaml), a .py script nor executable",
                        hint=f"chmod +x {p}, or run it through an interpreter in a job YAML command:")
    component: dict[str, object] = {"command": [python, full, *args] if p.suffix == ".py" else [full, *args]}
    if tasks_per_node is not None:
        component["tasks_per_node"] = tasks_per_node
    data: dict[str, object] = {"name": _job_name(p), "components": {SCRIPT_COMPONENT: component}}
    paths: dict[tuple[str | int, ...], str] = {}
    if overrides is not None and not overrides.is_empty():
        data = copy.deepcopy(data)
        paths = apply_overrides(data, overrides)
    if tasks_per_node is not None:  # its range is the spec's: an error names the flag
        paths[("components", SCRIPT_COMPONENT, "tasks_per_node")] = f"--ntasks-per-node {tasks_per_node}"
    return validate_spec_data(data, None, paths)

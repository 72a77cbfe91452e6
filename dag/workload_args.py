"""Typed ``workload_args``: checked by ``hetrun plan``/``submit`` without importing the workload.

A workload declares its arguments as a pydantic model in a light module next
to its own, found by a naming rule, so planning never imports torch:

    workload: pkg.mod:Class   ->   model ``ClassArgs`` in module ``pkg.mod_args``

(``hetrun.examples.ppo:PPOWorkload`` -> ``hetrun.examples.ppo_args:PPOWorkloadArgs``).
The workload module imports the same model and builds itself from it
(``validate_args``), so the plan-time check and the ranks' check are one.
A workload without an ``_args`` module is not checked before it runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from hetrun.dag.spec_errors import translate_validation_error
from hetrun.dag.yaml_source import KeyPath, SourceDoc
from pydantic import BaseModel, ValidationError

from hetrun.errors import SpecError

ArgsModel = TypeVar("ArgsModel", bound=BaseModel)


def args_model_ref(workload: str) -> tuple[str, str]:
    """``pkg.mod:Class`` -> (``pkg.mod_args``, ``ClassArgs``): where its arguments model lives."""
    module, _, cls = workload.partition(":")
    return f"{module}_args", f"{cls}Args"


@contextmanager
def _job_dir_on_path(job_dir: Path | None) -> Iterator[None]:
    """The ranks put the job YAML's directory on sys.path (plan.json job_dir); so does planning."""
    entry = str(job_dir.resolve()) if job_dir is not None else ""
    added = bool(entry) and entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added:
            sys.path.remove(entry)


def find_args_model(workload: str, job_dir: Path | None = None) -> type[BaseModel] | None:
    """The workload's arguments model, or None when it declares none (or its package is
    not importable here: then only the ranks can check). Raises ``SpecError`` when the
    ``_args`` module exists but is broken or lacks the model."""
    module_name, attr = args_model_ref(workload)
    with _job_dir_on_path(job_dir):
        try:
            found = importlib.util.find_spec(module_name)
        except ImportError:  # the parent package is not importable on this machine
            return None
        if found is None:
            return None
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any failure in user code is reported, not raised raw
            raise SpecError(f"cannot import {module_name} (the arguments model of {workload}): "
                            f"{type(exc).__name__}: {exc}", key_path="workload",
                            hint=f"fix {found.origin}") from None
    model = getattr(module, attr, None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise SpecError(f"{module_name} has no pydantic model {attr}", key_path="workload",
                        hint=f"define class {attr}(pydantic.BaseModel) in {found.origin}, "
                             f"or rename {found.origin} if it is not {workload}'s arguments module")
    return model


def validate_args(
    model: type[ArgsModel],
    args: Mapping[str, Any],
    doc: SourceDoc | None = None,
    override_paths: dict[KeyPath, str] | None = None,
) -> ArgsModel:
    """``model`` built from ``args``; errors name ``workload_args.<key>`` (with the
    file:line:col when ``doc`` is the job YAML)."""
    try:
        return model.model_validate(dict(args))
    except ValidationError as exc:
        raise translate_validation_error(exc, model, doc, override_paths or {},
                                         prefix=("workload_args",)) from None


def check_workload_args(
    workload: str,
    args: Mapping[str, Any],
    doc: SourceDoc | None,
    override_paths: dict[KeyPath, str] | None = None,
    job_dir: Path | None = None,
) -> bool:
    """Validate ``args`` against the workload's model; False when it declares none."""
    model = find_args_model(workload, job_dir)
    if model is None:
        return False
    validate_args(model, args, doc, override_paths)
    return True

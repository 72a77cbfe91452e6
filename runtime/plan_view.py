"""The runtime's reading of ``plan.json``: ``hetrun.planfile``'s typed view, re-validated.

The model is ``hetrun.planfile`` (standard library, shared with the batch script's
post-mortem, ``hetrun resume`` and the reports); the runtime reads the JSON
contract, not the planner's in-memory classes, so a rank never needs more of
``hetrun.dag`` than the errors. When the planner's ``Plan.from_json`` is
importable ``load_plan`` uses it first to validate the file, so a plan the
planner would reject is rejected here with the planner's message.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetrun.errors import RunDirError
from hetrun.planfile import (
    ActionSpec,
    CheckpointSection,
    ComponentSpec,
    Dep,
    PlanView,
    PreemptionSection,
    plan_from_dict,
    read_plan,
)
from hetrun.rundir import PLAN_JSON as PLAN_FILE
from hetrun.rundir import checkpoint_root

__all__ = ["PLAN_FILE", "ActionSpec", "CheckpointSection", "ComponentSpec", "Dep", "PlanView",
           "PreemptionSection", "checkpoint_root", "load_plan", "plan_from_dict"]


def load_plan(run_dir: str | os.PathLike[str], *, validate: bool = True) -> PlanView:
    """Read and check ``<run_dir>/plan.json``; raise RunDirError naming what is wrong.

    ``validate=False`` skips the planner's re-validation (it imports pydantic
    and the spec models: ~0.3 s per rank), for a plan already validated by an
    earlier attempt of the same run.
    """
    return read_plan(run_dir, validate=_validate_with_planner if validate else None)


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

"""The workload interface: user code the runtime drives action by action.

One instance per rank, built as ``Class(ctx, **workload_args)``. A workload
implements the methods of the action types its components run; a method that
is called but not implemented raises a RuntimeFailure naming the action.

Data flow the runtime provides (RL):
- ``rollout(policy_version)`` on rollout ranks returns a batch (dict of
  tensors). The runtime sends it to the learner rank(s) it feeds; a learner
  fed by several rollout ranks gets them merged with ``merge_batches``.
- ``forward(batch, micro, num_micro)`` on learner ranks gets the WHOLE merged
  batch of the iteration and the micro-batch index: the workload picks its
  micro-batch (PPO shuffles minibatches its own way).
- Supervised: ``forward`` gets ``next_batch(iteration, micro)``.
- ``backward(loss)``; ``sync`` all-reduces (averages) the ``.grad`` of
  ``parameters_to_sync()`` across the component; ``optimize()`` steps.
- After ``optimize`` the learner's component leader sends ``policy_state()``
  to the ranks whose actions depend on it; they get ``load_policy(state,
  version)`` before their next action. ``version`` = optimize steps taken.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrun.dag.validators import WORKLOAD_RE

from hetrun.errors import RuntimeFailure, SpecError

if TYPE_CHECKING:
    import torch

    from .context import RankContext
    from .plan_view import PlanView

class Workload:
    """Base class; subclasses override the methods their action types need."""

    def __init__(self, ctx: RankContext, **workload_args: Any) -> None:
        self.ctx = ctx
        self.workload_args = workload_args

    def _missing(self, method: str) -> RuntimeFailure:
        return RuntimeFailure(
            f"workload {type(self).__module__}:{type(self).__name__} does not implement "
            f"{method}(), needed by component {self.ctx.component!r}",
            hint=f"implement {method}() or remove the action that needs it from the component's actions",
        )

    # --- RL ---
    def rollout(self, policy_version: int) -> dict[str, torch.Tensor]:
        raise self._missing("rollout")

    def policy_state(self) -> dict[str, torch.Tensor]:
        raise self._missing("policy_state")

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        raise self._missing("load_policy")

    def merge_batches(self, batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Merge batches from several rollout ranks: concatenate along dim 0 (0-d: stack)."""
        import torch

        if len(batches) == 1:
            return batches[0]
        merged: dict[str, torch.Tensor] = {}
        for key in batches[0]:
            parts = [b[key] for b in batches]
            merged[key] = torch.stack(parts) if parts[0].dim() == 0 else torch.cat(parts, dim=0)
        return merged

    def batch_steps(self, batch: dict[str, torch.Tensor]) -> int:
        """Environment steps (or samples) in a batch, for throughput reports."""
        if "env_steps" in batch:
            return int(batch["env_steps"].sum().item())
        for value in batch.values():
            if value.dim() > 0:
                return int(value.shape[0])
        return 0

    # --- supervised ---
    def next_batch(self, iteration: int, micro: int) -> dict[str, torch.Tensor]:
        raise self._missing("next_batch")

    # --- learner ---
    def forward(self, batch: dict[str, torch.Tensor], micro: int, num_micro: int) -> torch.Tensor:
        raise self._missing("forward")

    def backward(self, loss: torch.Tensor) -> None:
        raise self._missing("backward")

    def parameters_to_sync(self) -> list[torch.Tensor]:
        """Parameters whose gradients ``sync`` averages across the component."""
        return []

    def optimize(self) -> dict[str, float]:
        raise self._missing("optimize")

    def evaluate(self) -> dict[str, float]:
        raise self._missing("evaluate")

    # --- checkpoints (tensors + JSON-able values; never pickled) ---
    def state_dict(self) -> dict[str, Any]:
        raise self._missing("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise self._missing("load_state_dict")


def check_workload_ref(ref: str, where: str = "workload") -> tuple[str, str]:
    if not WORKLOAD_RE.fullmatch(ref or ""):  # the spec's own rule (hetrun.dag.validators)
        raise SpecError(
            f"{ref!r} is not module:Class (dotted Python identifiers only)",
            key_path=where,
            value=ref,
            hint="e.g. workload: hetrun.examples.ppo:PPOWorkload",
        )
    module, _, cls = ref.partition(":")
    return module, cls


def workload_search_dirs(plan: PlanView, run_dir: Path) -> list[Path]:
    """Where a plan's workload module may live besides sys.path: the run directory, the job
    file's directory, and ``HETRUN_JOB_DIR``."""
    dirs = [run_dir]
    for key in ("job_dir", "job_file"):
        value = plan.raw.get(key)
        if value:
            p = Path(value)
            dirs.append(p if key == "job_dir" else p.parent)
    env_dir = os.environ.get("HETRUN_JOB_DIR")
    if env_dir:
        dirs.append(Path(env_dir))
    return dirs


def load_workload_class(ref: str, search_dirs: list[Path] | None = None) -> type[Workload]:
    """Import ``module:Class``; ``search_dirs`` (the job file's directory) go on sys.path."""
    module_name, cls_name = check_workload_ref(ref)
    for d in search_dirs or []:
        d_str = str(d)
        if d_str and d_str not in sys.path:
            sys.path.insert(0, d_str)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise RuntimeFailure(
                f"workload module {module_name!r} (from {ref!r}) cannot be imported: {exc}",
                hint="put it next to the job YAML or install it; searched also "
                + ", ".join(str(d) for d in search_dirs or []),
            ) from exc
        raise
    cls = getattr(module, cls_name, None)
    if cls is None:
        public = sorted(n for n in dir(module) if not n.startswith("_"))
        raise RuntimeFailure(
            f"module {module_name!r} has no class {cls_name!r} (workload {ref!r})",
            hint=f"names defined there: {', '.join(public[:20])}",
        )
    if not isinstance(cls, type):
        raise RuntimeFailure(f"{ref!r} is not a class (got {type(cls).__name__})")
    return cls

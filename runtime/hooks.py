"""The checkpoint and stop calls both executors make: the public run API's.

One implementation of each, shared with ``hetrun.attach()``'s ``Run``:

- restore: ``resume.restore_if_any(ctx, workload) -> int`` (what
  ``run.restore`` calls): on every rank before the loop; the iteration to
  start from (0 on a first run). ``resume.restored_pipeline(ctx)``: the
  executor's in-flight state (state messages consumers still need) of the
  checkpoint it restored.
- save: ``hetrun.runtime.api.run.save_state`` (what ``run.save`` calls):
  ``resume.save_checkpoint`` plus the ``checkpoint`` event. Every component
  at every checkpoint boundary and after a stop, on every rank of a
  component at the same point (it may use collectives on ``ctx.comm``).
- ``resume.flush(ctx)``: before the rank exits, wait for a background write.
- stop: ``preempt.stop_level(ctx)`` (0 go on, 1 requeue, 2 SIGTERM), the
  LOCAL check ``run.should_stop`` feeds its agreement, called at every action
  boundary and while waiting; the agreement itself is the API's
  (``hetrun.runtime.api.stop.IterationAgreement`` in the MPI executor); then
  ``preempt.agree(level)`` and ``preempt.exit_code(ctx)`` (default 85), as
  ``run.exit_for_requeue`` does.

``Hooks`` is a seam for tests: they replace the local stop check
(``should_stop`` / ``stop_level``) to stop a run at a chosen iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetrun.runtime import preempt, resume

from .context import RankContext

EXIT_REQUEUE = preempt.EXIT_REQUEUE


@dataclass
class Hooks:
    restore_if_any: Callable[[Any, Any], int] = resume.restore_if_any
    pipeline_of: Callable[[Any], Any] = resume.restored_pipeline
    should_stop: Callable[[Any], bool] | None = preempt.should_stop
    stop_level: Callable[[Any], int] | None = preempt.stop_level
    agree: Callable[[int], None] = preempt.agree
    exit_code: Callable[[Any], int] = preempt.exit_code
    flush: Callable[[Any], Any] = resume.flush

    def restore(self, ctx: RankContext, workload: Any) -> int:
        return int(self.restore_if_any(ctx, workload) or 0)

    def restored_pipeline(self, ctx: RankContext) -> Any:
        """The executor's pipeline state from the restored checkpoint, if any."""
        return self.pipeline_of(ctx)

    def stop_requested(self, ctx: RankContext) -> bool:
        return bool(self.should_stop(ctx)) if self.should_stop is not None else False

    def local_stop_level(self, ctx: RankContext) -> int:
        """0 go on, 1 stop + requeue, 2 stop on SIGTERM (what this rank alone sees)."""
        if self.stop_level is not None:
            return int(self.stop_level(ctx))
        return 1 if self.stop_requested(ctx) else 0

    def agreed_stop(self, level: int) -> None:
        self.agree(level)

    def flush_checkpoints(self, ctx: RankContext) -> Any:
        """Wait for a background checkpoint write in flight (before the rank exits)."""
        return self.flush(ctx)

    def stop_exit_code(self, ctx: RankContext) -> int:
        return int(self.exit_code(ctx))


def load_hooks() -> Hooks:
    """The run API's calls (kept as a function: tests replace parts of what it returns)."""
    return Hooks()

"""The checkpoint/preemption hooks the executor calls, and how they are found.

The checkpoint engineer implements them in ``hetrun.runtime.resume`` and
``hetrun.runtime.preempt``:

- ``resume.restore_if_any(ctx, workload) -> int``: before the loop, on every
  rank; returns the iteration to start from (0 on a first run).
- ``resume.save_checkpoint(ctx, workload, iteration, pipeline=None) -> dict | None``:
  every component at every checkpoint boundary and after a stop;
  ``iteration`` is the iteration a resumed run starts from; ``pipeline`` is
  the executor's in-flight state (state messages consumers still need),
  saved beside the workload's. Called on every rank of a component at the
  same point of the protocol (it may use collectives on ``ctx.comm``).
- ``resume.restored_pipeline(ctx)``: the ``pipeline`` of the checkpoint the
  last ``restore_if_any`` restored on this rank (None: none).
- ``resume.flush(ctx)``: before the rank exits, wait for a background write.
- ``preempt.should_stop(ctx) -> bool`` / ``preempt.stop_level(ctx) -> int``
  (0 go on, 1 requeue, 2 SIGTERM): a LOCAL check (signal flag, deadline),
  called at every action boundary and while waiting. Ranks of different
  components are at different iterations (that is the pipelining), so the
  executor itself makes the agreement (``executor.StopAgreement``: a
  non-blocking MAX all-reduce per iteration): all ranks stop before the same
  iteration, tell ``preempt.agree(level)`` what they agreed on, drain
  messages, checkpoint together and exit with ``preempt.exit_code(ctx)``
  (default 85).

A module that is absent means no support, said once in the log; nothing is
faked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXIT_REQUEUE = 85


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


@dataclass
class Hooks:
    restore_if_any: Callable[[Any, Any], int] | None = None
    save_checkpoint: Callable[..., Any] | None = None
    pipeline_of: Callable[[Any], Any] | None = None
    should_stop: Callable[[Any], bool] | None = None
    stop_level: Callable[[Any], int] | None = None
    agree: Callable[[int], None] | None = None
    exit_code: Callable[[Any], int] | None = None
    flush: Callable[[Any], Any] | None = None
    missing: list[str] = field(default_factory=list)

    def restore(self, ctx: Any, workload: Any) -> int:
        if self.restore_if_any is None:
            return 0
        start = self.restore_if_any(ctx, workload)
        return int(start or 0)

    def restored_pipeline(self, ctx: Any) -> Any:
        """The executor's pipeline state from the restored checkpoint, if any."""
        return self.pipeline_of(ctx) if self.pipeline_of is not None else None

    def stop_requested(self, ctx: Any) -> bool:
        return bool(self.should_stop(ctx)) if self.should_stop is not None else False

    def local_stop_level(self, ctx: Any) -> int:
        """0 go on, 1 stop + requeue, 2 stop on SIGTERM (what this rank alone sees)."""
        if self.stop_level is not None:
            return int(self.stop_level(ctx))
        return 1 if self.stop_requested(ctx) else 0

    def agreed_stop(self, level: int) -> None:
        if self.agree is not None:
            self.agree(level)

    def flush_checkpoints(self, ctx: Any) -> Any:
        """Wait for a background checkpoint write in flight (before the rank exits)."""
        return self.flush(ctx) if self.flush is not None else None

    def stop_exit_code(self, ctx: Any) -> int:
        return int(self.exit_code(ctx)) if self.exit_code is not None else EXIT_REQUEUE


def load_hooks() -> Hooks:
    resume = _import("hetrun.runtime.resume")
    preempt = _import("hetrun.runtime.preempt")
    hooks = Hooks()
    if resume is not None:
        hooks.restore_if_any = getattr(resume, "restore_if_any", None)
        hooks.save_checkpoint = getattr(resume, "save_checkpoint", None)
        hooks.flush = getattr(resume, "flush", None)
        hooks.pipeline_of = getattr(resume, "restored_pipeline", None)
    if preempt is not None:
        hooks.should_stop = getattr(preempt, "should_stop", None)
        hooks.stop_level = getattr(preempt, "stop_level", None)
        hooks.agree = getattr(preempt, "agree", None)
        hooks.exit_code = getattr(preempt, "exit_code", None)
    if hooks.restore_if_any is None:
        hooks.missing.append("resume (hetrun.runtime.resume.restore_if_any): runs start at iteration 0")
    if hooks.save_checkpoint is None:
        hooks.missing.append(
            "checkpoints (hetrun.runtime.resume.save_checkpoint): checkpoint actions are skipped"
        )
    if hooks.should_stop is None:
        hooks.missing.append("preemption (hetrun.runtime.preempt.should_stop): signals are not handled")
    return hooks

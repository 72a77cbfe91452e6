"""How a run's attempts ended, counted from its events.jsonl (``attempt_end`` lines).

The one counter of preemptions, time-limit requeues, failures and restarts:
the runtime's start-up budget check (``resume.restore_if_any``) and the
reports (``hetrun status`` / ``hetrun report``) use it, so they agree. The
rules themselves live in ``hetrun.dag.budgets`` (the batch script's
post-mortem applies the same ones without importing the runtime).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hetrun.dag.budgets import AttemptCounts, Budgets, count_attempts, preemption_budget_left

from .events import read_events


def attempt_counts(run_dir: str | os.PathLike[str], restart_count: int | None = None) -> AttemptCounts:
    """Counts over the run's ``attempt_end`` lines; give the current attempt's
    ``restart_count`` to also count restarts that have none (cause unknown)."""
    return count_attempts(read_events(run_dir, only="attempt_end"), restart_count=restart_count)


def preemption_budget_error(run_dir: str | os.PathLike[str], restart_count: int,
                            preemption: Mapping[str, Any] | None) -> str | None:
    """Why this restart exceeds ``preemption.max_preemptions`` (None: within it).

    The batch script and the local supervisor do not requeue past the budget;
    this catches the requeues Slurm makes itself (preemption with
    PreemptMode=REQUEUE, a manual ``scontrol requeue``).
    """
    budgets = Budgets.from_preemption(preemption)
    if budgets.max_preemptions is None or restart_count == 0:
        return None
    counts = attempt_counts(run_dir, restart_count)
    if preemption_budget_left(counts, budgets):
        return None
    return (f"restart {restart_count} exceeds preemption.{budgets.preemption_key}={budgets.max_preemptions} "
            f"({counts.preemptions} preemptions, {counts.time_limits} time-limit requeues, "
            f"{counts.unknown} restarts of unknown cause)")

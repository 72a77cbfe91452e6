"""Restart budgets: which ended attempt is requeued, counted from ``attempt_end`` records.

Pure rules over plain dicts (no I/O), so the batch script's post-mortem
(``hetrun.slurm_plugin.postmortem``), the local supervisor, the runtime's
start-up check and the reports all apply the same ones:

- preemptions (Slurm's SIGTERM) and time-limit requeues (the ``--signal``
  warning, exit 85) share ``preemption.max_preemptions`` (default None:
  unlimited, as submitit does). The old ``preemption.max_restarts`` is read as
  ``max_preemptions``: before budgets were split a failure was never
  requeued, so every restart it counted was one of these.
- failures (a rank died or raised) have ``preemption.max_failures`` (default
  0: a failure ends the run). ``max_failures > 0`` is the opt-in that
  requeues a failure; the run then resumes like after a preemption.
- a restart with no ``attempt_end`` before it (node failure, a manual
  ``scontrol requeue``, a killed batch shell) has an unknown cause; it counts
  as a preemption, since nothing says the job itself failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

OUTCOMES = ("done", "preempted", "time_limit", "failed", "cancelled")
PREEMPTION_OUTCOMES = frozenset({"preempted", "time_limit"})
UNKNOWN_CAUSE = "unknown (no attempt_end: node failure or manual requeue)"


@dataclass(frozen=True)
class Budgets:
    max_preemptions: int | None = None  # None: unlimited
    max_failures: int = 0
    preemption_key: str = "max_preemptions"  # the key the limit came from, for messages

    @classmethod
    def from_preemption(cls, pre: Mapping[str, Any] | None) -> Budgets:
        """From a plan's or spec's ``preemption`` section (dict); old plans included."""
        pre = pre or {}
        key = "max_preemptions"
        limit = pre.get("max_preemptions")
        if limit is None and pre.get("max_restarts") is not None:
            key, limit = "max_restarts", pre["max_restarts"]
        return cls(None if limit is None else int(limit), int(pre.get("max_failures") or 0), key)

    @property
    def requeue_on_failure(self) -> bool:
        return self.max_failures > 0


@dataclass(frozen=True)
class AttemptCounts:
    """What happened to a run's attempts so far."""

    attempts: int = 0  # attempts that wrote attempt_end
    preemptions: int = 0  # outcome "preempted"
    time_limits: int = 0  # outcome "time_limit"
    failures: int = 0  # outcome "failed"
    unknown: int = 0  # restarts with no attempt_end before them
    restarts: int = 0  # starts after the first (Slurm's restart count where known)

    @property
    def preemption_like(self) -> int:
        """What ``max_preemptions`` limits."""
        return self.preemptions + self.time_limits + self.unknown


def attempt_ends(records: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """The ``attempt_end`` record of each restart count (the last one written wins)."""
    out: dict[int, Mapping[str, Any]] = {}
    for rec in records:
        if rec.get("ev") == "attempt_end" and isinstance(rec.get("restart_count"), int):
            out[rec["restart_count"]] = rec
    return out


def count_attempts(records: Iterable[Mapping[str, Any]], restart_count: int | None = None) -> AttemptCounts:
    """Count ``attempt_end`` records; ``restart_count`` (the current attempt's) finds
    the restarts that have none (unknown cause). Without it, only the records count."""
    ends = attempt_ends(records)
    outcomes = [str(rec.get("outcome")) for rec in ends.values()]
    if restart_count is None:
        restart_count = sum(1 for rec in ends.values() if rec.get("requeued"))
        unknown = 0
    else:
        unknown = sum(1 for r in range(restart_count) if r not in ends)
    return AttemptCounts(
        attempts=len(ends), preemptions=outcomes.count("preempted"),
        time_limits=outcomes.count("time_limit"), failures=outcomes.count("failed"),
        unknown=unknown, restarts=restart_count,
    )


def preemption_budget_left(counts: AttemptCounts, budgets: Budgets) -> bool:
    return budgets.max_preemptions is None or counts.preemption_like <= budgets.max_preemptions


def should_requeue(outcome: str, counts: AttemptCounts, budgets: Budgets) -> tuple[bool, str]:
    """(requeue?, why) for an attempt that ended with ``outcome``; ``counts``
    include that attempt."""
    if outcome in ("done", "cancelled"):
        return False, outcome
    if not preemption_budget_left(counts, budgets):
        return False, (f"preemption.{budgets.preemption_key} ({budgets.max_preemptions}) reached "
                       f"after {counts.preemption_like} preemptions/time-limit requeues")
    if outcome in PREEMPTION_OUTCOMES:
        return True, f"{outcome.replace('_', ' ')}: requeue and resume"
    if not budgets.requeue_on_failure:
        return False, "failed; preemption.max_failures is 0 (set it above 0 to requeue failures)"
    if counts.failures > budgets.max_failures:
        return False, f"preemption.max_failures ({budgets.max_failures}) reached"
    return True, f"failure {counts.failures} of {budgets.max_failures} allowed: requeue and resume"

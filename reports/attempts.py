"""Attempts and restarts of a run, from its events alone (docs/CONTRACTS.md, "Attempts").

An attempt is one start of the job (a Slurm start or a local start), keyed by
``restart_count``. What each attempt did comes from the lines the runtime
and the batch script / local supervisor write:

- ``attempt_end`` (one per attempt): how it ended (done, preempted,
  time_limit, failed, cancelled);
- ``rank_failure``: which rank died, where, of what;
- ``restore`` (every rank of a restarted attempt): what that rank restored.

:func:`count_attempts` hands the lines to THE count of restarts, preemptions
and failures (``hetrun.dag.budgets.count_attempts``, which the runtime's
budget check and the batch script's post-mortem apply too): ``hetrun status``
and ``hetrun report`` both call it, so they cannot disagree. Never a claim the events do
not support: a component is "resumed at step S" only if every one of its
ranks in that attempt wrote ``restored_state: true`` for S.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hetrun.dag import budgets
from hetrun.dag.budgets import UNKNOWN_CAUSE, AttemptCounts

from .reader import EventStream, event_time

# Event kinds the attempt history needs; ``hetrun status`` reads only these.
COUNT_KINDS = ("start", "restore", "attempt_end", "rank_failure")
_CAUSE_TEXT = {"preempted": "preempted", "time_limit": "time limit", "failed": "failed",
               "cancelled": "cancelled", "done": "done"}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def count_attempts(restart_counts: set[int], ends: dict[int, dict[str, Any]]) -> AttemptCounts:
    """The one count (``hetrun.dag.budgets.count_attempts``, which the batch script's
    post-mortem and the runtime's budget check apply too) for the attempts seen in the
    events: the newest attempt's ``restart_count`` finds the restarts with no attempt_end."""
    seen = set(restart_counts) | set(ends)
    return budgets.count_attempts(ends.values(), restart_count=max(seen) if seen else None) \
        if seen else AttemptCounts()


def counts_dict(c: AttemptCounts) -> dict[str, int]:
    return {**asdict(c), "preemption_like": c.preemption_like}


def counts_of_run(run_dir: str | os.PathLike[str]) -> AttemptCounts:
    """:func:`count_attempts` over a run directory, reading only the lines it needs
    (what a runtime budget check may import)."""
    return status_summary(run_dir)[0]


def total_work_lost(history: list[dict[str, Any]]) -> int | None:
    """Iterations redone over all restarts; None when restarts happened and none could tell."""
    known = [r["work_lost_iterations"] for r in history if r.get("work_lost_iterations") is not None]
    return sum(known) if known else (0 if not history else None)


def status_summary(run_dir: str | os.PathLike[str]) -> tuple[AttemptCounts, int | None]:
    """Counts and work lost for ``hetrun status``: the report's functions over the few lines
    they need (no action line is parsed, so it stays fast on a long run)."""
    counts, lost, _ = status_details(run_dir)
    return counts, lost


def status_details(run_dir: str | os.PathLike[str]) -> tuple[AttemptCounts, int | None, Failure | None]:
    """:func:`status_summary` plus why the newest attempt failed (None unless it failed)."""
    tracker = AttemptTracker()
    for e in EventStream(run_dir, kinds=COUNT_KINDS):
        tracker.feed(e)
    return tracker.counts(), total_work_lost(tracker.history()), tracker.last_failure()


@dataclass
class Failure:
    """Why an attempt failed, for one line of ``hetrun status`` / ``submit --wait``:
    the failing rank's component (None when no line names one) and the text (the
    post-mortem's reason: rank, node, signal or exit code, and the rank's own error line)."""

    component: str | None
    text: str


@dataclass
class Attempt:
    """What one attempt did, gathered while the events stream past."""

    restart_count: int
    start_t: float | None = None  # the batch script's start (else the first rank's)
    first_t: float | None = None  # first event
    last_t: float | None = None  # last event
    first_action_end: float | None = None
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> component
    restores: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None  # the attempt_end line
    failures: list[dict[str, Any]] = field(default_factory=list)  # rank_failure lines
    errors: list[dict[str, Any]] = field(default_factory=list)  # the runtime's error lines
    exits: dict[int, int] = field(default_factory=dict)  # rank -> exit code
    # component -> last iteration with an action; component -> iteration -> first action start
    last_iteration: dict[str, int] = field(default_factory=dict)
    iteration_start: dict[str, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))

    def seen(self, t: float | None) -> None:
        if t is None:
            return
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)

    def action(self, comp: str, it: Any, start: float, end: float) -> None:
        """An action of this attempt (not a fused part): first step, iterations done."""
        if self.first_action_end is None or end < self.first_action_end:
            self.first_action_end = end
        if type(it) is not int:
            return
        if it > self.last_iteration.get(comp, -1):
            self.last_iteration[comp] = it
        starts = self.iteration_start[comp]
        if start < starts.get(it, start + 1):
            starts[it] = start

    def ended_at(self) -> float | None:
        return event_time(self.end) if self.end else self.last_t

    def sizes(self) -> dict[str, int]:
        """Ranks per component that started in this attempt (a resize changes them)."""
        out: dict[str, int] = defaultdict(int)
        for comp in self.ranks.values():
            out[comp] += 1
        return dict(out)


class AttemptTracker:
    """Feed every event once (in file order); then :meth:`history`, :meth:`counts`."""

    def __init__(self) -> None:
        self.attempts: dict[int, Attempt] = {}
        self._rank_attempt: dict[int, int] = {}  # a rank's actions belong to its latest start

    def _get(self, k: int) -> Attempt:
        if k not in self.attempts:
            self.attempts[k] = Attempt(k)
        return self.attempts[k]

    def feed(self, e: dict[str, Any]) -> None:
        ev, rank, t = e.get("ev"), _int(e.get("rank")), event_time(e)
        rc = _int(e.get("restart_count"))
        if ev == "start" and rank is not None:
            self._rank_attempt[rank] = rc or 0
        if rc is None:
            rc = self._rank_attempt.get(rank, 0) if rank is not None else None
        if rc is None:
            return
        a = self._get(rc)
        a.seen(t)
        if ev == "start" and rank is not None:
            a.ranks[rank] = str(e.get("component", "?"))
            a.start_t = _min(a.start_t, t)
        elif ev == "startup":
            for key in ("batch_start", "proc_start"):
                if isinstance(e.get(key), int | float):
                    a.start_t = _min(a.start_t, float(e[key]))
                    break
        elif ev == "action" and "part_of" not in e:
            a.action(str(e.get("component", "?")), e.get("iteration"), float(e.get("start") or 0.0),
                     float(e.get("end") or 0.0))
        elif ev == "restore":
            a.restores.append(e)
        elif ev == "attempt_end":
            a.end = e
        elif ev == "rank_failure":
            a.failures.append(e)
        elif ev == "error":
            a.errors.append(e)
        elif ev == "exit" and rank is not None:
            a.exits[rank] = _int(e.get("code")) if _int(e.get("code")) is not None else -1

    def attempt_of(self, rank: int) -> Attempt:
        """The attempt a rank's next action lines belong to (its latest start)."""
        return self._get(self._rank_attempt.get(rank, 0))

    def counts(self) -> AttemptCounts:
        return count_attempts(set(self.attempts), {k: a.end for k, a in self.attempts.items() if a.end})

    def history(self) -> list[dict[str, Any]]:
        """One row per restart (attempt 1, 2, ...): cause, queue wait, what was restored, work lost."""
        return [restart_row(self.attempts.get(k - 1), a)
                for k, a in sorted(self.attempts.items()) if k > 0]

    def last_failure(self) -> Failure | None:
        """Why the newest attempt failed, or None if it did not (or has not ended)."""
        if not self.attempts:
            return None
        last = self.attempts[max(self.attempts)]
        if (ignored := stop_ignored_reason(last.end)) is not None:
            # A command ended at the hard deadline (it ignored the stop): not a failure, but the why.
            ranks = [last.ranks.get(r) for r in last.end["stop_ignored"] if isinstance(r, int)]
            return Failure(next((c for c in ranks if c), None), ignored)
        if last.end is not None and last.end.get("outcome") != "failed":
            return None
        comps = [str(f["component"]) for f in last.failures if f.get("component")]
        if last.end is not None and last.end.get("reason"):
            return Failure(comps[0] if comps else None, str(last.end["reason"]))
        lines = failure_lines(last)
        return Failure(comps[0] if comps else None, "; ".join(lines)) if lines else None

    def outcome(self) -> dict[str, Any]:
        """How the newest attempt ended; older attempts' failures belong to the history."""
        if not self.attempts:
            return {"outcome": "not started", "attempt": None}
        last = self.attempts[max(self.attempts)]
        return {"attempt": last.restart_count, **describe_end(last)}


def _min(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None else min(a, b)


def stop_ignored_reason(end: Mapping[str, Any] | None) -> str | None:
    """attempt_end's reason when a command rank ignored the stop until the hard deadline."""
    if end is None or not end.get("stop_ignored") or not end.get("reason"):
        return None
    return str(end["reason"])


def describe_end(a: Attempt) -> dict[str, Any]:
    """outcome (attempt_end's word, or inferred from exit/error lines when there is none) + detail."""
    failures = failure_lines(a)
    if a.end is not None:
        if (ignored := stop_ignored_reason(a.end)) is not None:
            failures = [*failures, ignored]  # who ignored the stop, the work lost
        outcome = str(a.end.get("outcome") or "unknown")
        return {"outcome": outcome, "recorded": True, "exit_code": a.end.get("exit_code"),
                "reason": a.end.get("reason"), "requeued": a.end.get("requeued"), "failures": failures}
    if failures:
        outcome = "failed"
    elif a.exits and all(c == 0 for c in a.exits.values()) and set(a.exits) >= set(a.ranks):
        outcome = "done"
    elif a.exits and any(c == 85 for c in a.exits.values()):
        outcome = "checkpointed for requeue"
    else:
        outcome = "running or ended without a record"
    return {"outcome": outcome, "recorded": False, "failures": failures}


def failure_lines(a: Attempt) -> list[str]:
    """Who failed in an attempt, in words: rank_failure lines first (they name the dead rank),
    else the runtime's own error lines."""
    out = []
    for f in a.failures:
        what = f.get("signal") or (f"exit code {f['exit_code']}" if f.get("exit_code") is not None else "")
        who = f"rank {f.get('rank')}" + (f" ({f['component']})" if f.get("component") else "")
        where = f" on {f['node']}" if f.get("node") else ""
        msg = f": {f['message']}" if f.get("message") else ""
        said = f"; its last line: {f['last_line']}" if f.get("last_line") and f["last_line"] not in msg else ""
        out.append(f"{who}{where} {what}".rstrip() + f" [{f.get('detected_by', '?')}]{msg}{said}")
    if not out:
        for err in sorted(a.errors, key=lambda x: event_time(x) or 0):
            out.append(f"rank {err.get('rank')} ({err.get('component')}) in action {err.get('action')} "
                       f"iteration {err.get('iteration')}: {err.get('error')}")
    return out


def restored_components(a: Attempt) -> dict[str, dict[str, Any]]:
    """Per component of attempt ``a``: restored (every rank restored its own state for one
    step), fresh (with why), or unconfirmed (a runtime that did not write restored_state)."""
    by_comp: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in a.restores:
        by_comp[str(r.get("component", "?"))].append(r)
    expected: dict[str, set[int]] = defaultdict(set)
    for rank, comp in a.ranks.items():
        expected[comp].add(rank)
    out = {}
    for comp in list(expected) + [c for c in by_comp if c not in expected]:
        out[comp] = _component_restore(by_comp.get(comp, []), expected.get(comp, set()))
    return out


def _component_restore(evs: list[dict[str, Any]], ranks: set[int]) -> dict[str, Any]:
    wrote = {_int(e.get("rank")) for e in evs}
    steps = {e.get("step") for e in evs}
    flags = [e.get("restored_state") for e in evs]
    iterations = {_int(e.get("iteration")) for e in evs}
    row: dict[str, Any] = {"ranks": len(ranks | wrote), "ranks_restored": sum(f is True for f in flags),
                           "step": None, "iteration": None, "fresh_reason": None}
    missing = sorted(r for r in ranks - wrote if r is not None)
    if not evs:
        row.update(state="no restore recorded", fresh_reason="no rank wrote a restore event")
    elif all(f is True for f in flags) and not missing and len(steps) == 1 and None not in steps:
        row.update(state="restored", step=steps.pop(),
                   iteration=iterations.pop() if len(iterations) == 1 else None)
    elif any(f is True for f in flags) or (None in flags and None not in steps):
        why = ([f"ranks {missing} wrote no restore"] if missing else []) + \
              ([f"steps differ: {sorted(map(str, steps))}"] if len(steps) > 1 else []) + \
              (["restored_state not recorded (older runtime)"] if None in flags else []) + \
              ([f"{flags.count(False)} rank(s) started fresh"] if False in flags else [])
        row.update(state="unconfirmed", fresh_reason="; ".join(why),
                   step=next(iter(steps)) if len(steps) == 1 else None)
    else:
        reasons = sorted({str(e.get("fresh_reason") or e.get("message") or "no checkpoint yet")
                          for e in evs})
        row.update(state="fresh", iteration=0, fresh_reason="; ".join(reasons))
    return row


def restart_row(prev: Attempt | None, a: Attempt) -> dict[str, Any]:
    """One restart: why the previous attempt ended, the wait, what came back, what was lost."""
    cause = "unknown"
    detail: list[str] = []
    if prev is not None and prev.end is not None:
        cause = str(prev.end.get("outcome") or "unknown")
        detail = failure_lines(prev) if cause == "failed" else \
            [ignored] if (ignored := stop_ignored_reason(prev.end)) is not None else []
    elif prev is not None:
        detail = failure_lines(prev)
    cause_text = _CAUSE_TEXT.get(cause, cause) if prev is not None and prev.end is not None else UNKNOWN_CAUSE
    prev_end = prev.ended_at() if prev else None
    comps = restored_components(a)
    lost_it, lost_s, lost_actions = _work_lost(prev, comps, a)
    resumed = [c["iteration"] for c in comps.values() if c["state"] == "restored" and c["iteration"] is not None]
    return {
        "restart": a.restart_count, "cause": cause, "cause_text": cause_text, "detail": detail,
        "requeued": (prev.end or {}).get("requeued") if prev else None,
        "previous_end": prev_end, "start": a.start_t,
        "queue_wait_s": _diff(a.start_t, prev_end),
        "first_step_s": _diff(a.first_action_end, a.start_t),
        "resumed_iteration": min(resumed) if resumed else None,
        "components": comps, "work_lost_iterations": lost_it, "work_lost_s": lost_s,
        "work_lost_from_actions": lost_actions,
        # ranks per component before and after (hetrun resubmit --resize changes them)
        "sizes_before": prev.sizes() if prev else {}, "sizes": a.sizes(),
        "restore_s": max((float(r["seconds"]) for r in a.restores
                          if isinstance(r.get("seconds"), int | float)), default=None),
        "skipped": _skipped(a.restores),
    }


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 3) if a is not None and b is not None else None


def _skipped(restores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[Any, str] = {}
    for e in restores:
        for s in e.get("skipped") or []:
            if isinstance(s, dict):
                seen.setdefault(s.get("step"), str(s.get("why", "")))
    return [{"step": k, "why": v} for k, v in seen.items()]


def work_lost_from_restores(restores: list[dict[str, Any]]) -> int | None:
    """Iterations redone after one restart, as the ranks' ``restore`` lines say (resume.py
    computes each rank's from its own last action and what it really restored): the most any
    rank lost. ``hetrun status`` shows this figure too, so both commands agree."""
    known = [_int(r.get("work_lost")) for r in restores if _int(r.get("work_lost")) is not None]
    return max(known) if known else None


def _work_lost(prev: Attempt | None, comps: dict[str, dict[str, Any]],
               a: Attempt) -> tuple[int | None, float | None, int | None]:
    """(iterations from the restore lines, seconds, iterations from the action lines).

    From the actions: a component that restored iteration I lost the previous
    attempt's iterations >= I; one that started fresh lost all it did; the
    seconds run from the first redone iteration's start to the previous
    attempt's last event. A report shows both iteration figures when they differ.
    """
    from_restores = work_lost_from_restores(a.restores)
    if prev is None or not prev.last_iteration:
        return from_restores, None, None
    resumed = [c["iteration"] for c in comps.values() if c["state"] == "restored" and c["iteration"] is not None]
    lost_it, lost_s = 0, 0.0
    for comp, last in prev.last_iteration.items():
        info = comps.get(comp) or {}
        base = info.get("iteration") if info.get("state") in ("restored", "fresh") else min(resumed, default=0)
        base = base or 0
        lost_it = max(lost_it, max(0, last + 1 - base))
        redone = [t for it, t in prev.iteration_start.get(comp, {}).items() if it >= base]
        if redone and prev.last_t is not None:
            lost_s = max(lost_s, prev.last_t - min(redone))
    return (from_restores if from_restores is not None else lost_it), round(lost_s, 3), lost_it

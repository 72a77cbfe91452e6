"""Demand series of one run: per (component, action type, metric), one value per iteration.

Read from ``events.jsonl`` (runtime/events.py ``read_events``) action lines:
- ``busy_s``: rank-seconds the component spent in actions of that type in the
  iteration (summed over its ranks: the work to be spread over ranks);
- ``bytes``: bytes those actions moved (summed);
- ``peak_mem``: the largest ``peak_mem`` a rank reported (bytes); what memory
  to size for is :func:`peak_memory` (every attempt, processes shared).
The type is the event's ``type`` (a fused dispatch counts as its first member's).
Iterations a restart ran twice keep the last attempt's events. ``attempt``
keeps one attempt's events and ranks only (after a resize each attempt has
its own rank counts; tune sizes from the attempt it measures).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hetrun.runtime.events import read_events

METRICS = ("busy_s", "bytes", "peak_mem")


@dataclass
class DemandSeries:
    component: str
    action_type: str
    metric: str
    values: list[float]  # in iteration order
    iterations: list[int]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.component, self.action_type, self.metric)


@dataclass
class RunDemand:
    """Every series of a run, plus what sizing needs: ranks per component and env steps."""

    run_dir: str
    series: dict[tuple[str, str, str], DemandSeries]
    ranks: dict[str, int]  # component -> ranks seen in start events
    steps_per_iteration: dict[int, int] = field(default_factory=dict)  # iteration -> env steps/samples
    wall_s: float = 0.0  # first action start to last action end
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)  # iteration -> (first start, last end)

    def get(self, component: str, action_type: str, metric: str) -> DemandSeries | None:
        return self.series.get((component, action_type, metric))


def _action_events(run_dir: str | os.PathLike[str], only_attempt: int | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, set[int]]]:
    """Action events with start/end, a redone iteration's earlier attempts dropped; ranks per component
    (of ``only_attempt`` alone when given)."""
    ranks: dict[str, set[int]] = defaultdict(set)
    attempt: dict[int, int] = defaultdict(int)  # rank -> attempt its lines belong to (start lines say)
    tagged: list[tuple[int, dict[str, Any]]] = []
    newest: dict[tuple[int, int], int] = {}
    for e in read_events(run_dir):
        try:  # rank/iteration/restart_count of the wrong type: the line is skipped
            rank, it = int(e.get("rank", 0)), int(e.get("iteration", 0))
            restarts = int(e.get("restart_count") or 0)
        except (TypeError, ValueError):
            continue
        if e.get("ev") == "start":
            if only_attempt is None or restarts == only_attempt:
                ranks[str(e.get("component"))].add(rank)
            attempt[rank] = restarts
        elif e.get("ev") == "action" and "start" in e and "end" in e:
            if only_attempt is not None and attempt[rank] != only_attempt:
                continue
            key = (rank, it)
            newest[key] = max(newest.get(key, 0), attempt[rank])
            tagged.append((attempt[rank], e))
    kept = [e for att, e in tagged if att == newest[(int(e.get("rank", 0)), int(e.get("iteration", 0)))]]
    return kept, ranks


def read_demand(run_dir: str | os.PathLike[str], attempt: int | None = None) -> RunDemand:
    """The demand series of ``run_dir`` (empty when it has no action events yet); of one attempt
    (restart count) when ``attempt`` is given."""
    acc: dict[tuple[str, str, int], dict[str, float]] = defaultdict(
        lambda: {"busy_s": 0.0, "bytes": 0.0, "peak_mem": 0.0})
    steps: dict[int, int] = defaultdict(int)
    first, last = float("inf"), 0.0
    spans: dict[int, tuple[float, float]] = {}
    events, ranks = _action_events(run_dir, attempt)
    for e in events:
        try:  # a line with a field of the wrong type is skipped, as the report skips it
            it = int(e.get("iteration", 0))
            start, end = float(e["start"]), float(e["end"])
            busy, moved = max(0.0, end - start), float(e.get("bytes") or 0)
            peak = float(e.get("peak_mem") or 0)
            counted = e.get("steps") if e.get("type") == "rollout" else e.get("samples")
            work = int(counted) if counted is not None else 0
        except (TypeError, ValueError):
            continue
        row = acc[(str(e.get("component")), str(e.get("type")), it)]
        row["busy_s"] += busy
        row["bytes"] += moved
        row["peak_mem"] = max(row["peak_mem"], peak)
        steps[it] += work
        first, last = min(first, start), max(last, end)
        lo, hi = spans.get(it, (float(e["start"]), float(e["end"])))
        spans[it] = (min(lo, float(e["start"])), max(hi, float(e["end"])))
    series: dict[tuple[str, str, str], DemandSeries] = {}
    for (comp, kind, it) in sorted(acc, key=lambda k: (k[0], k[1], k[2])):
        for metric in METRICS:
            s = series.setdefault((comp, kind, metric), DemandSeries(comp, kind, metric, [], []))
            s.values.append(acc[(comp, kind, it)][metric])
            s.iterations.append(it)
    return RunDemand(str(run_dir), series, {c: len(r) for c, r in ranks.items()}, dict(steps),
                     max(0.0, last - first) if last else 0.0, spans)


def peak_memory(run_dir: str | os.PathLike[str]) -> dict[str, float]:
    """Component -> the largest ``peak_mem`` (bytes) any of its ranks reported, in any attempt.

    Unlike :func:`read_demand` nothing is dropped: a peak measured in an attempt
    that was preempted, or in an iteration that was redone, was still used, and
    memory sized below it would not hold the next run. ``peak_mem`` is the peak
    of the rank's process (runtime/dispatch.py); ranks that share a process
    (same host, pid and attempt in their start lines: an in-process run) each
    get that process's peak, whichever of them happened to report it last.
    """
    process: dict[int, tuple[str, str, int]] = {}  # rank -> (host, pid, attempt) of its newest start line
    comp_of: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    by_process: dict[tuple[str, str, int], float] = defaultdict(float)
    by_comp: dict[str, float] = defaultdict(float)
    for e in read_events(run_dir):
        try:
            rank = int(e.get("rank", 0))
            if e.get("ev") == "start":
                process.pop(rank, None)
                if e.get("pid") is not None:  # no pid said: the rank's own process
                    proc = (str(e.get("host")), str(e.get("pid")), int(e.get("restart_count") or 0))
                    process[rank] = proc
                    comp_of[proc].add(str(e.get("component")))
                continue
            if e.get("ev") != "action":
                continue
            peak = float(e.get("peak_mem") or 0)
        except (TypeError, ValueError):  # a field of the wrong type: the line is skipped
            continue
        comp = str(e.get("component"))
        by_comp[comp] = max(by_comp[comp], peak)
        if rank in process:
            by_process[process[rank]] = max(by_process[process[rank]], peak)
    for proc, peak in by_process.items():
        for comp in comp_of[proc]:
            by_comp[comp] = max(by_comp[comp], peak)
    return {c: v for c, v in by_comp.items() if v > 0}

"""What a run did, from its run directory alone (events.jsonl, plan.json, run.json).

Imports neither torch nor mpi4py: ``hetrun report`` is a light command.

Busy time is the sum of a rank's action durations (parts of a fused
dispatch, marked ``part_of``, are not counted twice); the busy fraction
divides it by the rank's lifetime (start event to exit, or to its last
event when killed). Cost counts each attempt (a restart is a new attempt)
separately: node-hours = wall x nodes the component used, core-hours = wall
x ranks x cpus per task, GPU-hours = wall x nodes x GPUs per node.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hetrun.errors import RunDirError
from hetrun.rundir import EVENTS as EVENTS_FILE
from hetrun.rundir import RunPaths

from .attempts import Attempt, AttemptTracker, counts_dict, status_summary, total_work_lost
from .ckpt import checkpoint_history
from .cost import DEFAULT_PRICES, run_cost
from .demand_section import demand_section
from .intervals import IntervalSet
from .placement import placement_section
from .reader import EventStream, event_time
from .sacct import slurm_accounting
from .samples import SampleStats
from .schema import SCHEMA_ID
from .throughput import ThroughputMeter
from .timeline import Timeline


@dataclass
class RankRow:
    component: str
    rank: int
    node: str
    actions: int = 0
    busy_s: float = 0.0
    life_s: float = 0.0
    bytes: int = 0
    peak_mem: int = 0
    by_type: dict[str, int] = field(default_factory=dict)

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.life_s if self.life_s > 0 else 0.0


@dataclass
class ComponentRow:
    name: str
    ranks: int = 0
    nodes: list[str] = field(default_factory=list)
    actions: int = 0
    busy_s: float = 0.0
    life_s: float = 0.0
    bytes: int = 0
    iterations: int = 0
    node_hours: float = 0.0
    core_hours: float = 0.0
    gpu_hours: float = 0.0
    first_action: float | None = None  # seconds after the run's first event
    last_action: float | None = None
    active_s: float = 0.0  # time at least one of its ranks was running an action
    command: bool = False  # runs the user's program (its steps are the run API's log() lines)

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.life_s if self.life_s > 0 else 0.0

    @property
    def s_per_iteration(self) -> float:
        if self.first_action is None or self.last_action is None or not self.iterations:
            return 0.0
        return (self.last_action - self.first_action) / self.iterations


@dataclass
class RunReport:
    run_dir: str
    name: str
    job_id: str | None
    backend: str | None
    first: float | None
    last: float | None
    attempts: int
    ranks: list[RankRow]
    components: list[ComponentRow]
    env_steps: int
    actions: int
    samples: int
    checkpoints: list[dict[str, Any]]
    restores: list[dict[str, Any]]
    preempts: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    warnings: list[str]
    metrics: dict[str, Any]
    exit_codes: dict[int, int]
    skipped_lines: int = 0
    # seconds in which components ran actions at the same time (pipelining), per pair
    overlap_s: dict[str, float] = field(default_factory=dict)
    # one row per restart, from the ``restore`` events of runtime/resume.py
    resumes: list[dict[str, Any]] = field(default_factory=list)
    # report_attempts: the one count (same as `hetrun status`), one row per restart
    # (cause, queue wait, what each component restored, work lost), the newest attempt's end
    counts: dict[str, int] = field(default_factory=dict)
    restart_history: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)
    work_lost_total: int | None = 0
    timeline: dict[str, Any] = field(default_factory=dict)
    # report_ckpt: {"rows": one per (component, step), "notes": [...]}
    checkpoint_history: dict[str, Any] = field(default_factory=dict)
    # report_sacct: {"rows": one per (component, attempt), "note": str | None}
    accounting: dict[str, Any] = field(default_factory=dict)
    # report_cost: total, per component, per iteration / million env steps, waste shares
    cost: dict[str, Any] = field(default_factory=dict)
    # report_samples: CPU/RSS/GPU per component and node from the runtime's sampler
    resources: dict[str, Any] = field(default_factory=dict)
    # report_demand: tune's predictor, per component/action type/metric, against what was measured
    demand: dict[str, Any] = field(default_factory=dict)
    # report_placement: where each component was placed (and why), per range of attempts
    placement: dict[str, Any] = field(default_factory=dict)
    # reports/throughput.py: steady and whole-run throughput per attempt (the one definition
    # `hetrun status --watch` and `hetrun tune` use too)
    throughput: dict[str, Any] = field(default_factory=dict)
    # report_headline: what a report leads with (outcome, result, throughput, waste, one
    # count of preemptions), from the sections above (headline())
    headline: dict[str, Any] = field(default_factory=dict)
    # report_curves: the return / loss metrics over the run, "<kind>.<key>" -> {"kind", "name",
    # "points": [[seconds from the first event, iteration, value], ...]} (thinned to at most
    # CURVE_POINTS, evenly); one rank's values per curve (the lowest that logged it)
    curves: dict[str, Any] = field(default_factory=dict)

    @property
    def restarts(self) -> int:
        """Restarts seen in the events (SLURM_RESTART_COUNT / HETRUN_RESTART_COUNT)."""
        return int(self.counts.get("restarts", 0))

    @property
    def work_lost(self) -> int | None:
        """Iterations redone over all restarts (None when no restart could tell)."""
        return self.work_lost_total

    @property
    def wall_s(self) -> float:
        return (self.last - self.first) if self.first is not None and self.last is not None else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def actions_per_s(self) -> float:
        return self.actions / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def node_hours(self) -> float:
        return sum(c.node_hours for c in self.components)

    @property
    def core_hours(self) -> float:
        return sum(c.core_hours for c in self.components)

    @property
    def gpu_hours(self) -> float:
        return sum(c.gpu_hours for c in self.components)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (reports/schema.py: REPORT_SCHEMA)."""
        d = {"schema": SCHEMA_ID, **asdict(self)}
        d.update(wall_s=self.wall_s, steps_per_s=self.steps_per_s, samples_per_s=self.samples_per_s,
                 actions_per_s=self.actions_per_s, node_hours=self.node_hours,
                 core_hours=self.core_hours, gpu_hours=self.gpu_hours,
                 restarts=self.restarts, work_lost=self.work_lost)
        for row, src in zip(d["ranks"], self.ranks, strict=True):
            row["busy_fraction"] = src.busy_fraction
        for crow, csrc in zip(d["components"], self.components, strict=True):
            crow["busy_fraction"] = csrc.busy_fraction
            crow["s_per_iteration"] = csrc.s_per_iteration
        return d


def restart_summary(run_dir: str | os.PathLike[str]) -> tuple[int, int | None]:
    """(restarts, iterations of work lost) as ``hetrun status`` shows them: the same
    functions as the report (report_attempts), over the few lines they need."""
    counts, lost = status_summary(run_dir)
    return counts.restarts, lost


def _startup_seconds(startups: list[dict[str, Any]], restores: list[dict[str, Any]]) -> dict[str, float]:
    """Timing of one attempt's start from its ranks' ``startup`` events (runtime/entry.py).

    From the batch script's start (else the first rank process's) to the last
    rank ready to run its workload, and to the last rank restored.
    """
    begins = [float(s[k]) for s in startups for k in ("batch_start", "proc_start")
              if isinstance(s.get(k), int | float)]
    ready = [float(s["executor_ready"]) for s in startups if isinstance(s.get("executor_ready"), int | float)]
    if not begins or not ready:
        return {}
    out = {"startup_s": round(max(ready) - min(begins), 3)}
    done = [float(r["time"]) for r in restores if isinstance(r.get("time"), int | float)]
    if done:
        out["start_to_restored_s"] = round(max(done) - min(begins), 3)
    return out


def summarize_resumes(restores: list[dict[str, Any]],
                      startups: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per restart from the per-rank ``restore`` events resume.py writes.

    Every rank writes one (``restart_count``, ``step``, ``work_lost``,
    ``skipped``, ``seconds``, ``max_restarts``); a row takes the iteration
    resumed from, the most work any rank lost, the slowest restore and every
    checkpoint skipped. Events without ``restart_count`` (older runtimes) are
    ignored here. With the attempts' ``startup`` events a row also has
    ``startup_s`` (batch script start to the last rank ready) and
    ``start_to_restored_s`` (to the last rank restored).
    """
    by_restart: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in restores:
        if isinstance(e.get("restart_count"), int):
            by_restart[e["restart_count"]].append(e)
    rows = []
    for restart in sorted(by_restart):
        evs = by_restart[restart]
        lost = [int(e["work_lost"]) for e in evs if isinstance(e.get("work_lost"), int)]
        secs = [float(e["seconds"]) for e in evs if isinstance(e.get("seconds"), int | float)]
        skipped: dict[Any, str] = {}
        for e in evs:
            for s in e.get("skipped") or []:
                if isinstance(s, dict):
                    skipped.setdefault(s.get("step"), str(s.get("why", "")))
        iterations = sorted({e["iteration"] for e in evs if isinstance(e.get("iteration"), int)})
        limits = [e["max_restarts"] for e in evs if isinstance(e.get("max_restarts"), int)]
        rows.append({
            "restart": restart,
            "step": next((e.get("step") for e in evs if e.get("step") is not None), None),
            "iteration": iterations[0] if len(iterations) == 1 else iterations,
            "ranks": len({e.get("rank") for e in evs}),
            "work_lost": max(lost) if lost else None,
            "seconds": max(secs) if secs else None,
            "max_restarts": min(limits) if limits else None,
            "skipped": [{"step": k, "why": v} for k, v in skipped.items()],
            **_startup_seconds([s for s in startups or () if s.get("restart_count") == restart], evs),
        })
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _spec_of(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from hetrun.runtime.plan_view import load_plan

    try:  # plan.json through the runtime's one reader; a missing or damaged one degrades the sections
        plan = load_plan(run_dir, validate=False).raw
    except RunDirError:
        plan = {}
    return _read_json(RunPaths(run_dir).run_json), plan


class _Collector:
    """One pass over the events: per rank and component totals, attempts, checkpoints.

    Keeps totals, unions of busy intervals and the few rare lines (checkpoints,
    restores, errors...), never the action lines themselves.
    """

    def __init__(self) -> None:
        self.ranks: dict[tuple[str, int], RankRow] = {}
        self.lives: dict[tuple[int, str, int], list[float]] = {}  # (attempt, comp, rank) -> [start, end]
        self.attempt_of_rank: dict[int, int] = {}
        self.attempt_keys: dict[Any, int] = {}
        self.wrapped: set[int] = set()  # ranks whose last start is a command wrapper's, before the API's
        self.iterations: dict[str, set[int]] = defaultdict(set)
        self.metrics: dict[str, Any] = {}
        self.env_steps = self.n_actions = self.samples = 0
        self.rare: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.warnings: list[str] = []
        self.exit_codes: dict[int, int] = defaultdict(int)
        self.first: float | None = None
        self.last: float | None = None
        self.spans: dict[str, IntervalSet] = defaultdict(IntervalSet)
        self.tracker = AttemptTracker()
        self.timeline = Timeline()
        self.cursors: dict[int, _Cursor] = {}
        self.samples_seen = SampleStats()
        self.bad_lines = 0
        self.curves: dict[str, _Curve] = {}

    def feed(self, e: dict[str, Any]) -> None:
        if e.get("ev") == "action":
            cur = self.cursors.get(e.get("rank"))  # type: ignore[arg-type]
            if cur is not None and cur.comp == e.get("component"):
                try:
                    self._action(e, cur)
                except (TypeError, ValueError):
                    self.bad_lines += 1  # a field of the wrong type (a hand-edited line): skipped
                return
        self._feed_any(e)

    def _feed_any(self, e: dict[str, Any]) -> None:
        """Every line but the common action case: the attempt tracker sees it too."""
        self.tracker.feed(e)
        t = event_time(e)
        if t is not None:
            self._seen(t)
        rank = e.get("rank")
        if not isinstance(rank, int):
            if e.get("ev") == "resume":  # hetrun resume's line: where the placement may have changed
                self.rare["resume"].append(e)
            return
        ev, comp = e.get("ev"), str(e.get("component", "?"))
        if ev == "start":
            self._start(e, rank, comp)
            return
        cur = self._cursor(rank, comp, str(e.get("node", "?")), t)
        if t is not None:
            cur.life[1] = max(cur.life[1], t)
        if ev == "action":
            self._action(e, cur, tracked=True)
        elif ev in ("checkpoint", "restore", "startup", "preempt", "error"):
            self.rare[ev].append(e)
        elif ev == "warning":
            msg = str(e.get("message", ""))
            if msg not in self.warnings:
                self.warnings.append(msg)
        elif ev == "exit":
            self.exit_codes[int(e.get("code", -1))] += 1
        elif ev == "sample":
            self.samples_seen.feed(e)
        if ev in ("checkpoint", "restore", "error"):
            self.timeline.mark(rank, ev, t)

    def _seen(self, t: float) -> None:
        if self.first is None or t < self.first:
            self.first = t
        if self.last is None or t > self.last:
            self.last = t

    def _cursor(self, rank: int, comp: str, node: str, t: float | None) -> _Cursor:
        """The rank's current attempt and component, cached so an action line costs a few updates."""
        cur = self.cursors.get(rank)
        attempt = self.attempt_of_rank.get(rank, 0)
        if cur is not None and cur.comp == comp and cur.attempt_no == attempt:
            return cur
        row = self.ranks.setdefault((comp, rank), RankRow(comp, rank, node))
        life = self.lives.setdefault((attempt, comp, rank), [float(t or 0), float(t or 0)])
        cur = _Cursor(comp, attempt, row, life, self.spans[comp], self.iterations[comp],
                      self.tracker.attempt_of(rank))
        self.cursors[rank] = cur
        return cur

    def _start(self, e: dict[str, Any], rank: int, comp: str) -> None:
        if e.get("api") and rank in self.wrapped:
            # The run API's start inside a command component: the same life as the
            # wrapper's start just before it (hetrun.runtime.command_rank), not a new attempt.
            self.wrapped.discard(rank)
            return
        self.wrapped.discard(rank)
        if e.get("command"):
            self.wrapped.add(rank)
        key = (e.get("job_id"), e.get("restart_count", 0))
        attempt = self.attempt_keys.setdefault(key, len(self.attempt_keys))
        if self.attempt_of_rank.get(rank) == attempt:
            # same key started again (local reruns): a new attempt
            attempt = self.attempt_keys[(key, len(self.attempt_keys))] = len(self.attempt_keys)
        self.attempt_of_rank[rank] = attempt
        self.lives[(attempt, comp, rank)] = [float(e["time"]), float(e["time"])]
        self._cursor(rank, comp, str(e.get("node", "?")), float(e["time"]))
        self.timeline.mark(rank, "start", float(e["time"]))

    def _action(self, e: dict[str, Any], cur: _Cursor, tracked: bool = False) -> None:
        # The hot path (nearly every line of a long run): locals and plain updates only.
        start, end = e.get("start") or 0.0, e.get("end") or 0.0
        if not tracked:
            if self.last is None or end > self.last:
                self.last = end
            if self.first is None or end < self.first:
                self.first = end
            if end > cur.life[1]:
                cur.life[1] = end
            att = cur.attempt
            if att.last_t is None or end > att.last_t:
                att.last_t = end
        kind = e.get("type", "?")
        row = cur.row
        it = e.get("iteration")
        if "part_of" not in e:
            cur.spans.add(start, end)
            self.timeline.add(row.rank, kind, start, end)
            row.actions += 1
            if end > start:
                row.busy_s += end - start
            row.by_type[kind] = row.by_type.get(kind, 0) + 1
            self.n_actions += 1
            if not tracked:
                cur.attempt.action(cur.comp, it, start, end)
        row.bytes += e.get("bytes") or 0
        peak = e.get("peak_mem") or 0
        if peak > row.peak_mem:
            row.peak_mem = peak
        if type(it) is int:
            cur.iters.add(it)
        steps = (e.get("steps") or 0) if kind == "rollout" else 0
        if steps:
            self.env_steps += steps
            self.timeline.count("env_steps", end, steps)
        done = e.get("samples") or 0
        if done:
            self.samples += done
            self.timeline.count("samples", end, done)
        metrics = e.get("metrics")
        if metrics and isinstance(metrics, dict):
            self.metrics[kind] = {"iteration": it, **metrics}
            for key in CURVE_KEYS.intersection(metrics):
                v = metrics[key]
                if isinstance(v, int | float) and not isinstance(v, bool):
                    curve = self.curves.setdefault(f"{kind}.{key}", _Curve(kind, key, row.rank))
                    if row.rank == curve.rank:
                        curve.add(end, it, float(v))


# The metrics a report plots over time (the headline's result keys, reports/run_report.headline_result).
_RETURN_KEYS = ("eval_return_mean", "episodic_return", "return_mean", "return", "reward")
_LOSS_KEYS = ("loss", "eval_loss", "val_loss", "train_loss")
CURVE_KEYS = frozenset(_RETURN_KEYS + _LOSS_KEYS)
CURVE_POINTS = 1000


class _Curve:
    """One metric over time from one rank, thinned as it grows: every ``stride``-th value is
    kept, and when CURVE_POINTS are held every other one is dropped and the stride doubles."""

    def __init__(self, kind: str, name: str, rank: int) -> None:
        self.kind, self.name, self.rank = kind, name, rank
        self.points: list[list[Any]] = []
        self.stride, self.seen = 1, 0

    def add(self, t: float, iteration: Any, value: float) -> None:
        self.seen += 1
        if (self.seen - 1) % self.stride:
            return
        self.points.append([t, iteration, value])
        if len(self.points) >= CURVE_POINTS:
            self.points = self.points[::2]
            self.stride *= 2

    def to_dict(self, origin: float) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "rank": self.rank,
                "points": [[round(t - origin, 3), it, v] for t, it, v in self.points]}


@dataclass
class _Cursor:
    """What an action line of one rank updates, looked up once per (rank, attempt, component)."""

    comp: str
    attempt_no: int
    row: RankRow
    life: list[float]
    spans: IntervalSet
    iters: set[int]
    attempt: Attempt


def _components(col: _Collector, comp_spec: dict[str, Any]) -> dict[str, ComponentRow]:
    for (_, comp, rank), (t0, t1) in col.lives.items():
        if (comp, rank) in col.ranks:
            col.ranks[(comp, rank)].life_s += max(0.0, t1 - t0)
    comps: dict[str, ComponentRow] = {}
    order = list(comp_spec) + sorted({c for c, _ in col.ranks} - set(comp_spec))
    for name in order:
        rows = [r for (c, _), r in col.ranks.items() if c == name]
        if not rows:
            continue
        spec = comp_spec.get(name, {})
        cr = ComponentRow(name=name, ranks=len(rows), nodes=sorted({r.node for r in rows}),
                          command=spec.get("command") is not None)
        cr.actions = sum(r.actions for r in rows)
        cr.busy_s = sum(r.busy_s for r in rows)
        cr.life_s = sum(r.life_s for r in rows)
        cr.bytes = sum(r.bytes for r in rows)
        cr.iterations = len(col.iterations.get(name, ()))
        cpus = int(spec.get("cpus_per_task", 1) or 1)
        gpus = int(spec.get("gpus_per_node", 0) or 0)
        by_attempt: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
        for (attempt, c, rank), (t0, t1) in col.lives.items():
            if c == name:
                node = col.ranks[(c, rank)].node if (c, rank) in col.ranks else "?"
                by_attempt[attempt].append((t0, t1, node))
        for rank_lives in by_attempt.values():
            wall_h = (max(s[1] for s in rank_lives) - min(s[0] for s in rank_lives)) / 3600
            nodes = len({s[2] for s in rank_lives})
            cr.node_hours += wall_h * nodes
            cr.core_hours += wall_h * len(rank_lives) * cpus
            cr.gpu_hours += wall_h * nodes * gpus
        union = col.spans.get(name)
        if union is not None and len(union) and col.first is not None:
            cr.first_action = (union.first() or 0.0) - col.first
            cr.last_action = (union.last() or 0.0) - col.first
            cr.active_s = union.length()
        comps[name] = cr
    return comps


def build_report(run_dir: str | os.PathLike[str], *, verify_checkpoints: bool = False,
                 accounting: bool = True, prices: dict[str, Any] | None = None) -> RunReport:
    """Everything ``hetrun report`` shows, from one streamed pass over events.jsonl, plus
    the checkpoint store's listing (``verify_checkpoints`` decodes every checkpoint) and
    Slurm's accounting (``accounting``: one sacct call)."""
    run_dir = Path(run_dir)
    _check_run_dir(run_dir)
    run, plan = _spec_of(run_dir)
    # sacct (~0.4 s for a real job's --json, nearly all of it waiting) answers on a thread
    # while this one reads the events and the store.
    early = _accounting_ahead(run, plan) if accounting else None
    comp_spec = {str(c.get("name")): c for c in plan.get("components", []) if isinstance(c, dict)}
    col = _Collector()
    meter = ThroughputMeter()
    stream = EventStream(run_dir)
    for e in stream:
        col.feed(e)
        meter.feed(e)
    comps = _components(col, comp_spec)
    names = list(comps)
    overlap = {f"{a}+{b}": col.spans[a].intersection(col.spans[b])
               for i, a in enumerate(names) for b in names[i + 1:]}
    history = col.tracker.history()
    counts = col.tracker.counts()
    rep = RunReport(
        run_dir=str(run_dir), name=str(run.get("name") or plan.get("name") or run_dir.name),
        job_id=run.get("job_id"), backend=run.get("backend"), first=col.first, last=col.last,
        attempts=max(len(col.attempt_keys), counts.attempts, 1 if stream.lines else 0),
        ranks=sorted(col.ranks.values(), key=lambda r: r.rank),
        components=list(comps.values()), env_steps=col.env_steps, actions=col.n_actions,
        samples=col.samples, checkpoints=col.rare["checkpoint"], restores=col.rare["restore"],
        preempts=col.rare["preempt"],
        errors=sorted(col.rare["error"], key=lambda e: e.get("time", 0)), warnings=col.warnings,
        metrics=col.metrics, exit_codes=dict(col.exit_codes), skipped_lines=stream.skipped + col.bad_lines,
        overlap_s=overlap, resumes=summarize_resumes(col.rare["restore"], col.rare["startup"]),
        counts=counts_dict(counts), restart_history=history, outcome=col.tracker.outcome(),
        work_lost_total=total_work_lost(history), timeline=col.timeline.to_dict(),
        throughput=meter.result().to_dict(),
        **_sections(run_dir, run, plan, col, comps, history, verify_checkpoints=verify_checkpoints,
                    accounting=accounting, prices=prices, early=early),
    )
    rep.headline = headline(rep)
    rep.curves = {k: c.to_dict(col.first or 0.0) for k, c in col.curves.items()}
    return rep


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory", hint="give a run directory")
    if not (run_dir / EVENTS_FILE).exists():
        raise RunDirError(
            f"{run_dir / EVENTS_FILE} does not exist: the run has not started (or this is not a run dir)",
            hint="check `hetrun status`; events appear once the runtime starts on the nodes",
        )


def _sections(run_dir: Path, run: dict[str, Any], plan: dict[str, Any], col: _Collector,
              comps: dict[str, ComponentRow], history: list[dict[str, Any]], *, verify_checkpoints: bool,
              accounting: bool, prices: dict[str, Any] | None,
              early: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's sections beyond the event totals, each from its own module. A new section is
    one more key here (a field of RunReport of the same name, and one in report_schema).
    ``early``: the accounting asked ahead on a thread (``_accounting_ahead``)."""
    if not accounting:
        acc: dict[str, Any] = {"rows": [], "note": "not asked"}
    else:
        acc = early() if early is not None else _accounting(run, plan, comps)
    return {
        "checkpoint_history": checkpoint_history(run_dir, plan, col.rare["checkpoint"], history,
                                                 verify=verify_checkpoints),
        "accounting": acc,
        "cost": _cost(col, plan, comps, acc, history, prices),
        "resources": col.samples_seen.to_dict(),
        "demand": demand_section(run_dir),
        "placement": placement_section(run_dir, plan, [e["restart_count"] for e in col.rare["resume"]
                                                       if isinstance(e.get("restart_count"), int)], acc["rows"]),
    }


def _cost(col: _Collector, plan: dict[str, Any], comps: dict[str, ComponentRow], acc: dict[str, Any],
          history: list[dict[str, Any]], prices: dict[str, Any] | None) -> dict[str, Any]:
    """Allocated hours times the price table, per iteration and env step, and the share wasted.

    Idle time inside the allocation is measured only where ranks say when they work (actions,
    or a command's run-API steps): a component with neither is left out of the idle share and
    named in ``idle_unmeasured`` (a report never calls a job it cannot see "100% idle")."""
    attempts_wall = sum((a.last_t or 0) - (a.start_t or a.first_t or a.last_t or 0)
                        for a in col.tracker.attempts.values())
    rows = list(comps.values())
    cost = run_cost(prices or DEFAULT_PRICES, acc["rows"], rows, (plan.get("slurm") or {}).get("partition"),
                    iterations=max((c.iterations for c in rows), default=0),
                    env_steps=col.env_steps, lost_s=sum(r["work_lost_s"] or 0 for r in history),
                    attempts_wall_s=attempts_wall)
    blind = [c.name for c in rows if not c.actions]
    if cost and blind:
        seen = [c for c in rows if c.actions]
        life = sum(c.life_s for c in seen)
        idle = (1.0 - sum(c.busy_s for c in seen) / life) if life > 0 else 0.0
        restart = cost["wasted_restarts_share"]
        cost["wasted_idle_share"] = round(idle, 4)
        cost["wasted_share"] = round(restart + (1 - restart) * idle, 4)  # as run_cost combines them
    if cost:
        cost["idle_unmeasured"] = blind
    return cost


# Where the result of a run is, in order: an evaluation, a command's own logged step, the
# learner's update (action types' metrics as the runtime records them).
_RESULT_KINDS = ("eval", "step", "sync", "optimize", "backward", "forward")


def headline_result(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The figure a report leads with: the newest evaluation return, else a loss, with the
    action type and iteration (a command's step) it came from; None when nothing logged one."""
    for keys in (_RETURN_KEYS, _LOSS_KEYS):
        for kind in _RESULT_KINDS:
            m = metrics.get(kind) or {}
            for key in keys:
                v = m.get(key)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    return {"kind": kind, "name": key, "value": float(v), "iteration": m.get("iteration")}
    return None


def headline(rep: RunReport) -> dict[str, Any]:
    """What the report says first: did it work (status of the newest attempt), the result,
    how fast, what was wasted, and the one count of restarts and preemptions (the same
    ``counts`` as ``hetrun status``; a command job writes no executor ``preempt`` line)."""
    from .throughput import headline as throughput_headline

    out = rep.outcome or {}
    c = rep.counts
    steps = {x.name: x.iterations for x in rep.components if x.command}
    tp = throughput_headline(rep.throughput) if (rep.throughput or {}).get("useful_work") else ""
    if not tp and steps:  # a command job: its run-API steps over the time they ran
        rates = [x.iterations / x.active_s for x in rep.components if x.command and x.active_s > 0]
        tp = f"steps/s {max(rates):,.2f} (logged steps over the time between them)" if rates else ""
    cost = rep.cost or {}
    return {
        "status": out.get("outcome"), "attempt": out.get("attempt"),
        "failure": (out.get("failures") or [None])[0],
        "result": headline_result(rep.metrics),
        "throughput": tp or None,
        "wasted_share": cost.get("wasted_share"),
        "restarts": int(c.get("restarts", 0)), "preemptions": int(c.get("preemptions", 0)),
        "work_lost_iterations": rep.work_lost,
        "command_steps": steps,
    }


def _accounting_ahead(run: dict[str, Any], plan: dict[str, Any]) -> Callable[[], dict[str, Any]] | None:
    """Start ``_accounting`` on a thread when the component names are known without the events
    (run.json or plan.json lists them); the returned call waits for it (and raises what it
    raised). None: the names come from the events, so it is asked afterwards."""
    if not (run.get("components") or [c for c in plan.get("components", []) if isinstance(c, dict)]):
        return None
    import threading

    got: dict[str, Any] = {}

    def ask() -> None:
        try:
            got["acc"] = _accounting(run, plan, {})
        except BaseException as exc:  # raised again on the caller's thread
            got["error"] = exc

    thread = threading.Thread(target=ask, name="hetrun-sacct", daemon=True)
    thread.start()

    def result() -> dict[str, Any]:
        thread.join()
        if "error" in got:
            raise got["error"]
        return got["acc"]

    return result


def _accounting(run: dict[str, Any], plan: dict[str, Any], comps: dict[str, ComponentRow]) -> dict[str, Any]:
    names = [str(n) for n in run.get("components") or
             [c.get("name") for c in plan.get("components", []) if isinstance(c, dict)] or list(comps)]
    submitted = run.get("submitted_at")
    not_before = None
    if isinstance(submitted, str):
        with contextlib.suppress(ValueError):
            not_before = datetime.fromisoformat(submitted.replace("Z", "+00:00")).timestamp()
    return slurm_accounting(run.get("job_id"), run.get("backend"), names,
                            name=run.get("name") or plan.get("name"), not_before=not_before)

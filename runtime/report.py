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

import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetrun.dag.errors import RunDirError

from .events import EVENTS_FILE, read_events


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

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.life_s if self.life_s > 0 else 0.0

    @property
    def s_per_iteration(self) -> float:
        if self.first_action is None or self.last_action is None or not self.iterations:
            return 0.0
        return (self.last_action - self.first_action) / self.iterations


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


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

    @property
    def restarts(self) -> int:
        """Restarts seen by the runtime (SLURM_RESTART_COUNT / HETRUN_RESTART_COUNT)."""
        return max((int(r["restart"]) for r in self.resumes), default=0)

    @property
    def work_lost(self) -> int | None:
        """Iterations redone over all restarts (None when no restart could tell)."""
        known = [int(r["work_lost"]) for r in self.resumes if r.get("work_lost") is not None]
        return sum(known) if known else (0 if not self.resumes else None)

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
        d = asdict(self)
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
    """(restarts, iterations of work lost) from a run's ``restore`` events only.

    Cheap enough for ``hetrun status`` over many runs: other event lines are
    not parsed. Work lost is None when no restart recorded it.
    """
    rows = summarize_resumes(list(read_events(run_dir, only="restore")))
    restarts = max((int(r["restart"]) for r in rows), default=0)
    known = [int(r["work_lost"]) for r in rows if r.get("work_lost") is not None]
    return restarts, (sum(known) if known else (0 if not rows else None))


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


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def build_report(run_dir: str | os.PathLike[str]) -> RunReport:
    run_dir = Path(run_dir)
    events_path = run_dir / EVENTS_FILE
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory", hint="give a run directory")
    if not events_path.exists():
        raise RunDirError(
            f"{events_path} does not exist: the run has not started (or this is not a run dir)",
            hint="check `hetrun status`; events appear once the runtime starts on the nodes",
        )
    run = _read_json(run_dir / "run.json")
    plan = _read_json(run_dir / "plan.json")
    comp_spec = {str(c.get("name")): c for c in plan.get("components", []) if isinstance(c, dict)}
    events = list(read_events(run_dir))
    skipped = _count_lines(events_path) - len(events)

    # An attempt = one start of the job (a requeue starts a new one).
    ranks: dict[tuple[str, int], RankRow] = {}
    lives: dict[tuple[int, str, int], list[float]] = {}  # (attempt, comp, rank) -> [start, end]
    attempt_of_rank: dict[int, int] = {}
    attempt_keys: dict[Any, int] = {}
    iterations: dict[str, set[int]] = defaultdict(set)
    metrics: dict[str, Any] = {}
    env_steps = n_actions = samples = 0
    checkpoints, restores, preempts, errors = [], [], [], []
    startups: list[dict[str, Any]] = []
    warnings: list[str] = []
    exit_codes: dict[int, int] = defaultdict(int)
    times: list[float] = []
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)

    for e in events:
        ev = e.get("ev")
        rank = e.get("rank")
        comp = str(e.get("component", "?"))
        t = e.get("end") or e.get("time")
        if isinstance(t, int | float):
            times.append(float(t))
        if not isinstance(rank, int):
            continue
        if ev == "start":
            key = (e.get("job_id"), e.get("restart_count", 0))
            attempt = attempt_keys.setdefault(key, len(attempt_keys))
            if rank in attempt_of_rank and attempt_of_rank[rank] == attempt:
                # same key started again (local reruns): a new attempt
                attempt = attempt_keys[(key, len(attempt_keys))] = len(attempt_keys)
            attempt_of_rank[rank] = attempt
            lives[(attempt, comp, rank)] = [float(e["time"]), float(e["time"])]
            ranks.setdefault((comp, rank), RankRow(comp, rank, str(e.get("node", "?"))))
            continue
        attempt = attempt_of_rank.get(rank, 0)
        life = lives.setdefault((attempt, comp, rank), [float(t or 0), float(t or 0)])
        if isinstance(t, int | float):
            life[1] = max(life[1], float(t))
        row = ranks.setdefault((comp, rank), RankRow(comp, rank, str(e.get("node", "?"))))
        if ev == "action":
            dur = max(0.0, float(e.get("end", 0)) - float(e.get("start", 0)))
            if "part_of" not in e:
                spans[comp].append((float(e.get("start", 0)), float(e.get("end", 0))))
                row.actions += 1
                row.busy_s += dur
                row.by_type[e.get("type", "?")] = row.by_type.get(e.get("type", "?"), 0) + 1
                n_actions += 1
            row.bytes += int(e.get("bytes", 0) or 0)
            row.peak_mem = max(row.peak_mem, int(e.get("peak_mem", 0) or 0))
            if isinstance(e.get("iteration"), int):
                iterations[comp].add(e["iteration"])
            if e.get("type") == "rollout":
                env_steps += int(e.get("steps", 0) or 0)
            samples += int(e.get("samples", 0) or 0)
            if isinstance(e.get("metrics"), dict) and e["metrics"]:
                metrics[e.get("type", "?")] = {"iteration": e.get("iteration"), **e["metrics"]}
        elif ev == "checkpoint":
            checkpoints.append(e)
        elif ev == "restore":
            restores.append(e)
        elif ev == "startup":
            startups.append(e)
        elif ev == "preempt":
            preempts.append(e)
        elif ev == "error":
            errors.append(e)
        elif ev == "warning":
            msg = str(e.get("message", ""))
            if msg not in warnings:
                warnings.append(msg)
        elif ev == "exit":
            exit_codes[int(e.get("code", -1))] += 1

    for (_, comp, rank), (t0, t1) in lives.items():
        if (comp, rank) in ranks:
            ranks[(comp, rank)].life_s += max(0.0, t1 - t0)

    comps: dict[str, ComponentRow] = {}
    order = list(comp_spec) + sorted({c for c, _ in ranks} - set(comp_spec))
    for name in order:
        rows = [r for (c, _), r in ranks.items() if c == name]
        if not rows:
            continue
        spec = comp_spec.get(name, {})
        cr = ComponentRow(name=name, ranks=len(rows), nodes=sorted({r.node for r in rows}))
        cr.actions = sum(r.actions for r in rows)
        cr.busy_s = sum(r.busy_s for r in rows)
        cr.life_s = sum(r.life_s for r in rows)
        cr.bytes = sum(r.bytes for r in rows)
        cr.iterations = len(iterations.get(name, ()))
        cpus = int(spec.get("cpus_per_task", 1) or 1)
        gpus = int(spec.get("gpus_per_node", 0) or 0)
        by_attempt: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
        for (attempt, c, rank), (t0, t1) in lives.items():
            if c == name:
                by_attempt[attempt].append((t0, t1, ranks[(c, rank)].node if (c, rank) in ranks
                                            else "?"))
        for rank_lives in by_attempt.values():
            wall_h = (max(s[1] for s in rank_lives) - min(s[0] for s in rank_lives)) / 3600
            nodes = len({s[2] for s in rank_lives})
            cr.node_hours += wall_h * nodes
            cr.core_hours += wall_h * len(rank_lives) * cpus
            cr.gpu_hours += wall_h * nodes * gpus
        union = _union(spans.get(name, []))
        if union and times:
            cr.first_action = union[0][0] - min(times)
            cr.last_action = union[-1][1] - min(times)
            cr.active_s = _length(union)
        comps[name] = cr

    names = list(comps)
    overlap = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            overlap[f"{a}+{b}"] = _intersection(_union(spans[a]), _union(spans[b]))

    return RunReport(
        run_dir=str(run_dir), name=str(run.get("name") or plan.get("name") or run_dir.name),
        job_id=run.get("job_id"), backend=run.get("backend"),
        first=min(times) if times else None, last=max(times) if times else None,
        attempts=max(len(attempt_keys), 1 if events else 0),
        ranks=sorted(ranks.values(), key=lambda r: r.rank),
        components=list(comps.values()), env_steps=env_steps, actions=n_actions, samples=samples,
        checkpoints=checkpoints, restores=restores, preempts=preempts,
        errors=sorted(errors, key=lambda e: e.get("time", 0)), warnings=warnings,
        metrics=metrics, exit_codes=dict(exit_codes), skipped_lines=max(0, skipped),
        overlap_s=overlap, resumes=summarize_resumes(restores, startups),
    )

"""What ``hetrun status --watch`` shows of a run, read incrementally from events.jsonl.

Each refresh reads only the bytes appended since the last one (complete
lines; a line being written waits for the next refresh), so watching a long
run costs what it writes, not its length. Restart counts use the same
function as ``hetrun report`` (report_attempts.count_attempts); throughput the
same definition as `hetrun report` and `hetrun tune` (reports/throughput.py:
the newest attempt's steady figure, with that attempt's sizes, and the whole
run's, fed the same events).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrun.runtime.plan_view import load_plan

from hetrun.errors import HetrunError
from hetrun.rundir import events_after

from .attempts import AttemptCounts, count_attempts
from .ckpt import store_root
from .reader import event_time
from .throughput import ThroughputMeter


@dataclass
class LiveRun:
    run_dir: Path
    total_iterations: int | None = None
    offset: int = 0
    iteration: int | None = None  # newest iteration with a finished action
    first_action: float | None = None
    last_action: float | None = None
    iterations_seen: set[int] = field(default_factory=set)
    env_steps: int = 0
    samples: int = 0
    last_checkpoint: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    restart_counts: set[int] = field(default_factory=set)
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)
    outcome: str | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    checkpoint_bytes: dict[tuple[str, int], int] = field(default_factory=dict)  # found in the store
    meter: ThroughputMeter = field(default_factory=ThroughputMeter)

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str]) -> LiveRun:
        run = cls(Path(run_dir))
        try:
            view = load_plan(run.run_dir, validate=False)
        except HetrunError:  # no plan.json yet, or a damaged one: the view shows what the events say
            return run
        run.plan = view.raw
        with contextlib.suppress(TypeError, ValueError):
            run.total_iterations = view.iterations or None
        return run

    def poll(self) -> bool:
        """Read what was appended; True when something new arrived."""
        records, self.offset = events_after(self.run_dir, self.offset)
        for e in records:
            self._feed(e)
        return bool(records)

    def _feed(self, e: dict[str, Any]) -> None:
        self.meter.feed(e)
        ev = e.get("ev")
        rc = e.get("restart_count")
        if isinstance(rc, int) and not isinstance(rc, bool):
            self.restart_counts.add(rc)
        if ev == "action" and "part_of" not in e:
            end = event_time(e)
            it = e.get("iteration")
            if isinstance(it, int):
                self.iterations_seen.add(it)
                self.iteration = it if self.iteration is None else max(self.iteration, it)
            if end is not None:
                self.first_action = end if self.first_action is None else min(self.first_action, end)
                self.last_action = end if self.last_action is None else max(self.last_action, end)
            if e.get("type") == "rollout":
                self.env_steps += int(e.get("steps") or 0)
            self.samples += int(e.get("samples") or 0)
            if isinstance(e.get("metrics"), dict) and e["metrics"]:
                self.metrics = {"type": e.get("type"), "iteration": it, **e["metrics"]}
        elif ev == "checkpoint":
            self.last_checkpoint = e
        elif ev == "attempt_end" and isinstance(rc, int):
            self.ends[rc] = e
            self.outcome = str(e.get("outcome"))

    def counts(self) -> AttemptCounts:
        return count_attempts(self.restart_counts, self.ends)

    def last_checkpoint_bytes(self) -> int | None:
        """Bytes the last checkpoint added to its component's store; None until the store lists it
        (the write finishes after the event). Asks the store (as the report does) once per new step."""
        ck = self.last_checkpoint or {}
        info: dict[str, Any] = ck["info"] if isinstance(ck.get("info"), dict) else {}
        step = info.get("step", ck.get("iteration"))
        if not isinstance(step, int):
            return None
        key = (str(ck.get("component", "?")), step)
        if key not in self.checkpoint_bytes:
            path = store_root(self.run_dir, self.plan) / key[0]
            if not (path / "manifests").is_dir():
                return None
            # imports torch: only once a checkpoint exists
            from hetrun.runtime.ckpt import open_store

            try:
                sizes = {i.step: i.stored_bytes for i in open_store(path).info()}
            except (HetrunError, OSError, ValueError):
                return None
            if step not in sizes:
                return None
            self.checkpoint_bytes[key] = sizes[step]
        return self.checkpoint_bytes[key]

    def progress(self, now: float | None = None) -> dict[str, Any]:
        """iteration, total, fraction, rates, ETA, last checkpoint's age and size, restarts, metrics."""
        now = time.time() if now is None else now
        done = len(self.iterations_seen)
        span = (self.last_action - self.first_action) if self.first_action is not None \
            and self.last_action is not None else 0.0
        it_rate = (done - 1) / span if span > 0 and done > 1 else None
        left = (self.total_iterations - done) if self.total_iterations else None
        ck = self.last_checkpoint
        info = (ck or {}).get("info") if isinstance((ck or {}).get("info"), dict) else {}
        tp = self.meter.result()
        steady = tp.steady_attempt()
        newest = tp.newest()
        return {
            "iterations_done": done, "total": self.total_iterations,
            "fraction": done / self.total_iterations if self.total_iterations else None,
            "iterations_per_s": it_rate,
            # reports/throughput.py: the newest attempt's steady rate (median window after warm-up),
            # None until it has enough iterations; the whole run's beside it, gaps included
            "steps_per_s": steady.steady if steady is not None else None,
            "throughput_unit": tp.unit, "whole_run_per_s": tp.whole_run,
            "attempt": steady.attempt if steady is not None else (newest.attempt if newest else None),
            "sizes": (steady or newest).sizes if (steady or newest) is not None else {},
            "eta_s": left / it_rate if it_rate and left is not None and left > 0 else None,
            "checkpoint_step": (info or {}).get("step", (ck or {}).get("iteration")) if ck else None,
            "checkpoint_age_s": now - (event_time(ck) or now) if ck else None,
            "checkpoint_bytes": self.last_checkpoint_bytes() if ck else None,
            "restarts": self.counts().restarts, "metrics": self.metrics, "outcome": self.outcome,
        }

"""One definition of a run's throughput, for `hetrun report`, `hetrun status --watch` and `hetrun tune`.

Work is env steps (``steps`` of rollout actions) or, for a run that reports
none, samples (``samples`` of any action). Every figure is per attempt (a
resize or a requeue starts one), with the attempt's own ranks per component,
and the run as a whole is shown apart:

- **steady** (per attempt): the attempt's iterations in order, the first
  ``warmup_iterations(n)`` left out (process start, first batch, the pipeline
  filling); the rest cut into windows of ``window_size(n)`` consecutive
  iterations. A window's rate is its work over the time from the end of the
  iteration before it (the last action end of that iteration) to the end of
  its own last iteration, so windows tile the attempt with no gap and a
  pipelined run (iteration i+1's rollout during iteration i's update) is
  timed by completions. Steady = the median window; its spread (lowest and
  highest window) says how sure the figure is. None while fewer than
  :data:`MIN_WINDOWS` windows exist.
- **active** (per attempt): all its work over first action start to last
  action end (warm-up included, start-up not).
- **start-up** (per attempt): the batch script's (else first rank's) start
  to its first action start.
- **queue gap** (per attempt after the first): the previous attempt's last
  event to this attempt's start (pending in the queue, requeue, resize).
- **whole run**: useful work (an iteration redone after a restart counts
  once, the newest attempt's) over the first attempt's start to the last
  action end: start-up and queue gaps included, and shown beside it.

Feed every event once, in file order (:meth:`ThroughputMeter.feed`), then
:meth:`ThroughputMeter.result`; :func:`run_throughput` does both for a run
directory. The meter keeps one small record per (attempt, iteration), never
the action lines.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from .reader import event_time

MIN_WINDOWS = 2


def warmup_iterations(n: int) -> int:
    """Iterations of an attempt left out of its steady figure: 1, or a tenth of a long attempt."""
    return max(1, n // 10)


def window_size(n: int) -> int:
    """Iterations per window for an attempt of ``n`` iterations: about eight windows after warm-up."""
    return max(1, (n - warmup_iterations(n)) // 8)


@dataclass
class AttemptThroughput:
    attempt: int  # restart count: 0 first, then each requeue/resize
    sizes: dict[str, int]  # ranks per component that started in this attempt
    iterations: int  # iterations with an action in this attempt
    work: int  # env steps (or samples) of this attempt's actions
    steady: float | None  # per second; module docstring
    spread: tuple[float, float] | None  # lowest and highest window
    windows: int  # windows the steady figure is the median of
    window_iterations: int
    warmup: int  # iterations left out
    active: float | None  # work / (last action end - first action start)
    startup_s: float | None
    queue_gap_s: float | None  # None for the first attempt

    @property
    def relative_spread(self) -> float | None:
        """Half the window range over the median: the steady figure's +/- share."""
        if self.steady is None or self.spread is None or self.steady <= 0:
            return None
        return (self.spread[1] - self.spread[0]) / 2 / self.steady


@dataclass
class Throughput:
    unit: str  # "env steps" or "samples"
    attempts: list[AttemptThroughput]
    useful_work: int  # an iteration redone after a restart counted once
    whole_run: float | None  # useful work / (first start -> last action end)
    wall_s: float
    startup_s: float  # all attempts
    queue_gaps_s: float

    def newest(self) -> AttemptThroughput | None:
        return self.attempts[-1] if self.attempts else None

    def steady_attempt(self) -> AttemptThroughput | None:
        """The newest attempt with a steady figure (what the run does at its current sizes)."""
        return next((a for a in reversed(self.attempts) if a.steady is not None), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for row, a in zip(d["attempts"], self.attempts, strict=True):
            row["spread"] = list(a.spread) if a.spread else None
            row["relative_spread"] = a.relative_spread
        return d

    def lines(self) -> list[str]:
        """Labelled plain text (`hetrun report`, `hetrun tune`)."""
        return throughput_lines(self.to_dict())


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def throughput_lines(d: dict[str, Any]) -> list[str]:
    """Labelled plain text of :meth:`Throughput.to_dict` (the report's ``throughput`` section)."""
    if not d or not d.get("attempts"):
        return []
    u = d["unit"]
    out = [f"throughput ({u}/s; steady = median of windows after warm-up; whole run = useful work "
           "over wall, start-up and queue gaps included):"]
    for a in d["attempts"]:
        sizes = " ".join(f"{c}={n}" for c, n in a["sizes"].items()) or "?"
        if a["steady"] is not None and a["spread"]:
            steady = (f"steady {_rate(a['steady'])} (windows {_rate(a['spread'][0])}-{_rate(a['spread'][1])}, "
                      f"{a['windows']} x {a['window_iterations']} it after {a['warmup']} warm-up)")
        else:
            steady = (f"steady: too short ({a['iterations']} iterations, "
                      f"{warmup_iterations(a['iterations']) + MIN_WINDOWS} needed)")
        extra = [f"active {_rate(a['active'])}",
                 f"start-up {a['startup_s']:.1f}s" if a["startup_s"] is not None else None,
                 f"queue gap {a['queue_gap_s']:.1f}s" if a["queue_gap_s"] is not None else None]
        out.append(f"  attempt {a['attempt']} [{sizes}]: {steady}; " + "; ".join(x for x in extra if x))
    out.append(f"  whole run: {_rate(d['whole_run'])} ({d['useful_work']:,} useful {u} in {d['wall_s']:.1f}s, "
               f"of which start-up {d['startup_s']:.1f}s and queue gaps {d['queue_gaps_s']:.1f}s)")
    return out


def headline(d: dict[str, Any]) -> str:
    """One labelled figure for a summary line: the newest attempt's steady rate and the whole run's."""
    atts = (d or {}).get("attempts") or []
    if not atts:
        return ""
    steady = next((a for a in reversed(atts) if a["steady"] is not None), None)
    head = f"{d['unit']}/s steady {_rate(steady['steady'])}" if steady else f"{d['unit']}/s steady -"
    if steady and len(atts) > 1:
        head += f" (attempt {steady['attempt']})"
    return head + f", whole run {_rate(d['whole_run'])}"


@dataclass
class _Iter:
    start: float = math.inf
    end: float = -math.inf
    steps: int = 0
    samples: int = 0


@dataclass
class _Att:
    start_t: float | None = None  # batch script / first rank process start
    last_t: float | None = None  # last event of the attempt
    ranks: dict[int, str] = field(default_factory=dict)
    its: dict[int, _Iter] = field(default_factory=lambda: defaultdict(_Iter))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class ThroughputMeter:
    """Accumulates what the throughput figures need from a stream of events."""

    def __init__(self) -> None:
        self._att: dict[int, _Att] = defaultdict(_Att)
        self._rank_attempt: dict[int, int] = {}

    def feed(self, e: dict[str, Any]) -> None:
        ev, rank = e.get("ev"), _int(e.get("rank"))
        rc = _int(e.get("restart_count"))
        if ev == "start" and rank is not None:
            self._rank_attempt[rank] = rc or 0
        if rc is None:
            rc = self._rank_attempt.get(rank, 0) if rank is not None else 0
        a = self._att[rc]
        t = event_time(e)
        if t is not None:
            a.last_t = t if a.last_t is None else max(a.last_t, t)
        if ev == "start" and rank is not None:
            a.ranks[rank] = str(e.get("component", "?"))
            if t is not None:
                a.start_t = t if a.start_t is None else min(a.start_t, t)
        elif ev == "startup":
            for key in ("batch_start", "proc_start"):
                v = _num(e.get(key))
                if v is not None:
                    a.start_t = v if a.start_t is None else min(a.start_t, v)
                    break
        elif ev == "action" and "part_of" not in e:
            it, start, end = _int(e.get("iteration")), _num(e.get("start")), _num(e.get("end"))
            if it is None or start is None or end is None:
                return
            row = a.its[it]
            row.start, row.end = min(row.start, start), max(row.end, end)
            if e.get("type") == "rollout":
                row.steps += _int(e.get("steps")) or 0
            row.samples += _int(e.get("samples")) or 0

    def result(self) -> Throughput:
        atts = sorted((k, a) for k, a in self._att.items() if a.its or a.ranks)
        steps = sum(r.steps for _, a in atts for r in a.its.values())
        unit, key = ("env steps", "steps") if steps or not any(
            r.samples for _, a in atts for r in a.its.values()) else ("samples", "samples")
        rows: list[AttemptThroughput] = []
        prev_end: float | None = None
        newest_of: dict[int, tuple[int, int]] = {}  # iteration -> (attempt, its work)
        for k, a in atts:
            its = sorted(a.its.items())
            for i, r in its:
                newest_of[i] = (k, getattr(r, key))
            first = min((r.start for _, r in its), default=None)
            last = max((r.end for _, r in its), default=None)
            start = a.start_t if a.start_t is not None else first
            work = sum(getattr(r, key) for _, r in its)
            sizes: dict[str, int] = defaultdict(int)
            for comp in a.ranks.values():
                sizes[comp] += 1
            steady, spread, nwin, wsize, warm = _steady([(r.end, getattr(r, key)) for _, r in its])
            rows.append(AttemptThroughput(
                attempt=k, sizes=dict(sizes), iterations=len(its), work=work, steady=steady, spread=spread,
                windows=nwin, window_iterations=wsize, warmup=warm,
                active=work / (last - first) if first is not None and last is not None and last > first else None,
                startup_s=max(0.0, first - start) if first is not None and start is not None else None,
                queue_gap_s=max(0.0, start - prev_end) if prev_end is not None and start is not None else None))
            prev_end = a.last_t if a.last_t is not None else last
        useful = sum(w for _, w in newest_of.values())
        begin = next((a.start_t if a.start_t is not None else min((r.start for r in a.its.values()), default=None)
                      for _, a in atts), None)
        end = max((r.end for _, a in atts for r in a.its.values()), default=None)
        wall = (end - begin) if begin is not None and end is not None else 0.0
        return Throughput(unit, rows, useful, useful / wall if wall > 0 else None, max(0.0, wall),
                          sum(r.startup_s or 0.0 for r in rows), sum(r.queue_gap_s or 0.0 for r in rows))


def steady_rate(done: list[tuple[float, int]]) -> tuple[float | None, tuple[float, float] | None]:
    """The steady rule on any loop's iteration ends (e.g. a stable-baselines3 run timed by a
    callback): ``done`` = (end time, work) per iteration in order -> (median window, (low, high))."""
    steady, spread, *_ = _steady(done)
    return steady, spread


def _steady(done: list[tuple[float, int]]) -> tuple[float | None, tuple[float, float] | None, int, int, int]:
    """(median window rate, (lowest, highest), windows, iterations per window, warm-up) of one
    attempt's iterations in order, as (end, work) pairs."""
    n = len(done)
    warm, size = warmup_iterations(n), window_size(n)
    rates = []
    anchor = warm - 1  # the end of the last warm-up iteration starts the first window
    while anchor + size < n:
        last = anchor + size
        span = done[last][0] - done[anchor][0]
        if span > 0:
            rates.append(sum(w for _, w in done[anchor + 1:last + 1]) / span)
        anchor = last
    if len(rates) < MIN_WINDOWS:
        return None, None, len(rates), size, warm
    return statistics.median(rates), (min(rates), max(rates)), len(rates), size, warm


def run_throughput(run_dir: str | os.PathLike[str]) -> Throughput:
    """The throughput figures of a run directory's events.jsonl."""
    from hetrun.runtime.events import read_events

    meter = ThroughputMeter()
    for e in read_events(run_dir):
        if isinstance(e, dict):
            meter.feed(e)
    return meter.result()

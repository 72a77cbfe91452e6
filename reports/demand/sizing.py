"""``hetrun tune``: component sizes from a run's measured (and predicted) demand.

Model (stated so a reader can check it): every component's work grows with
the env steps (or samples) of an iteration, and each component's ranks split
it evenly. From the run's steady iterations, component c costs ``r_c``
rank-seconds per env step (its predicted busy seconds per iteration over the
steps of an iteration). With ``n_c`` ranks the pipeline moves at
``min_c n_c / r_c`` steps per second (the slowest component sets the pace;
the others wait), and a step costs ``sum_c n_c * price_c / throughput``
where ``price_c`` is the component's hourly rank price from the report's price
table (cpus x core_hour + gpus x gpu_hour). Within the same number of cores
as the measured job (or ``max_cores``), the proposal is the rank mix with the
lowest cost per step, ties going to the higher throughput. Communication
does not enter the model: adding data-parallel learners adds gradient
all-reduces it does not price.

Memory, per rank (a YAML's ``mem`` is per node: the proposal's ``--set`` gives
the node the rank's memory times its tasks): the largest peak any rank of the
component reported in any attempt (series.peak_memory; ranks sharing a process
share its peak), plus ``margin``, rounded up to 64 MiB, never less, also when the
rank counts are kept: a configured memory below what a rank measured is raised to
it; and never below what the run's own plan needs (plan_floor: actions that
declare their memory, the micro-batches in flight). cpus_per_task stays as
measured: events do not say how an action would scale with more threads. A
rank's price includes its memory where the price table has ``mem_gb_hour``.

What it is fitted on, and how sure it is: the newest attempt with a steady
throughput (hetrun.reports.throughput: after a resize each attempt has its own
rank counts; the queue gap between attempts is no throughput). The model's
pace for the measured sizes is compared with that attempt's measured steady
throughput; the ratio (measured / model: the pipeline's efficiency the model
leaves out, communication and waiting) calibrates the proposal's predicted
throughput and cost, and the spread of the measured windows is shown with it.

Never a change the model predicts to cost more: when the cheapest mix within
the budget costs at least what the measured sizes cost per step, the proposal
is to keep them (``decision`` "keep", ``reason`` says why).
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetrun.dag.rank_layout import layout_sets, rank_layout

from hetrun.errors import SpecError

from ..throughput import run_throughput
from .plan_floor import memory_floor_mb, rank_mem_mb
from .predictors import EWMA, Predictor
from .series import RunDemand, peak_memory, read_demand

_MIB = 1024 * 1024
# A fitted attempt whose steady part is shorter than this measures its job's rate no better than
# ~+/-15-18 % from run to run, whatever its windows' spread says (benchmarks/cost_tuning.md, session
# 23: CartPole two runs of one job at ~2.5 s steady differed by up to 18 %, at ~10 s by 0-6 %).
SHORT_STEADY_S = 10.0


@dataclass
class ComponentSize:
    name: str
    ranks: int
    cpus_per_task: int
    gpus_per_rank: float
    mem_mb: int  # per rank (a YAML's mem is per node: mem_per_node_mb)
    busy_s_per_step: float = 0.0  # rank-seconds per env step (predicted)
    tasks_per_node: int = 1  # the job's own layout, kept where it divides the ranks
    utilization: float = 0.0  # busy share of its ranks' time at the model's pace

    @property
    def mem_per_node_mb(self) -> int:
        """The YAML's ``mem`` for these ranks laid out as rank_layout lays them out."""
        return self.mem_mb * rank_layout(self.ranks, self.tasks_per_node)[1]

    def mem_set(self) -> str:
        return f"components.{self.name}.mem={self.mem_per_node_mb}M"


@dataclass
class Proposal:
    run_dir: str
    steps_per_iteration: float
    measured_steps_per_s: float  # the fitted attempt's steady throughput (median window)
    current: list[ComponentSize]
    proposed: list[ComponentSize]
    current_steps_per_s: float  # the model's pace for the measured sizes (uncalibrated)
    proposed_steps_per_s: float  # the model's pace for the proposed sizes (uncalibrated)
    current_cost_per_m: float  # currency per million env steps, at the measured steady throughput
    proposed_cost_per_m: float  # predicted, at the calibrated throughput
    currency: str
    predictor: str
    notes: list[str] = field(default_factory=list)
    attempt: int = 0  # the attempt the model was fitted on
    unit: str = "env steps"
    measured_spread: tuple[float, float] | None = None  # lowest and highest window
    whole_run_steps_per_s: float | None = None  # start-up and queue gaps included (not the model's)
    calibration: float = 1.0  # measured steady / model pace for the measured sizes
    decision: str = "resize"  # or "keep"
    reason: str = ""

    @property
    def predicted_steps_per_s(self) -> float:
        """The proposal's throughput as the model predicts it, calibrated on the measured attempt."""
        return self.proposed_steps_per_s * self.calibration

    @property
    def cost_cut(self) -> float:
        """Share of the cost per step saved (positive: cheaper); 0 when kept."""
        return 1.0 - self.proposed_cost_per_m / self.current_cost_per_m if self.current_cost_per_m else 0.0

    @property
    def cost_change(self) -> float:
        """Predicted change of the cost per step (negative: a cut), as printed ("-25.0% cost")."""
        return self.proposed_cost_per_m / self.current_cost_per_m - 1.0 if self.current_cost_per_m else 0.0

    @property
    def model_error(self) -> float | None:
        """Model pace for the measured sizes against the measured steady throughput (+: model too fast)."""
        return self.current_steps_per_s / self.measured_steps_per_s - 1 if self.measured_steps_per_s else None

    @property
    def relative_spread(self) -> float | None:
        s = self.measured_spread
        return (s[1] - s[0]) / 2 / self.measured_steps_per_s if s and self.measured_steps_per_s else None

    def overrides(self) -> list[str]:
        """``--set`` arguments that give a new submit the proposed sizes."""
        return [s for c in self.proposed for s in (*layout_sets(c.name, c.ranks, c.tasks_per_node), c.mem_set())]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cost_cut": self.cost_cut, "cost_change": self.cost_change,
                "predicted_steps_per_s": self.predicted_steps_per_s, "model_error": self.model_error,
                "relative_spread": self.relative_spread, "overrides": self.overrides()}


def _plan(run_dir: Path) -> dict[str, Any]:
    from hetrun.runtime.plan_view import load_plan

    return load_plan(run_dir, validate=False).raw  # RunDirError names a missing or damaged plan.json


def _steady(values: Sequence[float], skip: int) -> list[float]:
    return list(values[skip:] if len(values) > skip + 1 else values)


def predicted_busy(demand: RunDemand, component: str, predictor: Predictor, skip: int) -> float:
    """Predicted busy rank-seconds of ``component`` per iteration, its action types summed.

    Each type's series is predicted on its own (the chooser may use the LSTM for
    some types only) and weighted by how often the type runs (eval every k iterations).
    """
    iterations = len(demand.spans) or 1
    total = 0.0
    for (comp, _kind, metric), s in demand.series.items():
        if comp != component or metric != "busy_s" or not s.values:
            continue
        values = _steady(s.values, skip if len(s.values) == iterations else 0)
        total += predictor.predict(values, s) * len(s.values) / iterations
    return total


def needed_mem_mb(peak_bytes: float, margin: float) -> int | None:
    """The memory to ask for a rank measured at ``peak_bytes``: plus ``margin``, rounded up to
    64 MiB (None: nothing measured). Never below the peak: the rounding only goes up."""
    if peak_bytes <= 0:
        return None
    return max(64, math.ceil(peak_bytes / _MIB * (1 + max(0.0, margin)) / 64) * 64)


def steady_seconds(attempt: Any, steps_per_iteration: float) -> float | None:
    """Seconds of the attempt's steady part (its iterations after warm-up at its steady rate)."""
    if attempt is None or not attempt.steady:
        return None
    return (attempt.iterations - attempt.warmup) * steps_per_iteration / attempt.steady


def _needed(run: Path, comp: dict[str, Any], peak_bytes: float, margin: float) -> int | None:
    """Per-rank memory to propose for ``comp``: the measured peak plus margin, raised to what
    the run's plan needs (plan_floor); None when nothing was measured."""
    want = needed_mem_mb(peak_bytes, margin)
    return None if want is None else memory_floor_mb(run, comp, want)


def _rank_price(comp: dict[str, Any], prices: dict[str, Any], partition: str | None,
                mem_mb: float | None = None) -> tuple[float, float]:
    """(price per rank-hour, gpus per rank) from the price table (partition rates override);
    ``mem_mb``: the rank's memory (default: the component's per node over its tasks per node)."""
    rates = {**prices, **((prices.get("partitions") or {}).get(partition or "", {}))}
    gpu_rate = rates.get("gpu_hour", 0.0)
    if isinstance(gpu_rate, dict):
        gpu_rate = gpu_rate.get("default", 0.0)
    ntasks = max(1, int(comp.get("ntasks", 1)))
    gpus = float(comp.get("gpus_per_node", 0)) * int(comp.get("nodes", 1)) / ntasks
    cpu_rate = float(rates.get("core_hour", 0.0))
    mem_gb = (rank_mem_mb(comp) if mem_mb is None else mem_mb) / 1024
    return (int(comp.get("cpus_per_task", 1)) * cpu_rate + gpus * float(gpu_rate)
            + mem_gb * float(rates.get("mem_gb_hour", 0.0))), gpus


def _pace(ranks: tuple[int, ...], per_step: list[float]) -> float:
    """Steps per second of the pipeline: its slowest component's."""
    rates = [n / r for n, r in zip(ranks, per_step, strict=True) if r > 0]
    return min(rates) if rates else 0.0


def _cost_per_m(ranks: tuple[int, ...], price: list[float], pace: float) -> float:
    per_hour = sum(n * p for n, p in zip(ranks, price, strict=True))
    return per_hour / 3600.0 / pace * 1e6 if pace > 0 else math.inf


def _key(ranks: tuple[int, ...], per_step: list[float], price: list[float]) -> tuple[float, float, tuple[int, ...]]:
    pace = _pace(ranks, per_step)
    return (round(_cost_per_m(ranks, price, pace), 12), -pace, ranks)  # cheapest, then fastest


def _search(per_step: list[float], price: list[float], cpus: list[int], max_cores: int,
            max_ranks: int) -> tuple[int, ...]:
    """The rank mix within ``max_cores`` with the lowest cost per step (exhaustive when small)."""
    def fits(ranks: tuple[int, ...]) -> bool:
        return sum(n * c for n, c in zip(ranks, cpus, strict=True)) <= max_cores

    start = tuple(1 for _ in per_step)
    if not fits(start):
        raise SpecError(f"no rank mix fits in {max_cores} cores",
                        hint="raise --max-cores to at least one rank per component")
    if max_ranks ** len(per_step) <= 200_000:
        mixes = (r for r in itertools.product(range(1, max_ranks + 1), repeat=len(per_step)) if fits(r))
        return min(mixes, key=lambda r: _key(r, per_step, price))
    # Large budgets: grow the bottleneck one rank at a time (the linear model's optimum is balance).
    best, ranks = start, start
    while True:
        slowest = min(range(len(ranks)), key=lambda i: ranks[i] / per_step[i] if per_step[i] > 0 else math.inf)
        grown = tuple(n + (i == slowest) for i, n in enumerate(ranks))
        if not fits(grown):
            return best
        ranks = grown
        best = min(best, ranks, key=lambda r: _key(r, per_step, price))


def propose(run_dir: str | os.PathLike[str], prices: dict[str, Any], *, predictor: Predictor | None = None,
            margin: float = 0.25, max_cores: int | None = None, skip: int = 1) -> Proposal:
    """The sizing proposal for ``run_dir`` (module docstring: the model and its limits)."""
    run = Path(run_dir)
    plan = _plan(run)
    tp = run_throughput(run)
    fitted = tp.steady_attempt() or tp.newest()
    attempt = fitted.attempt if fitted is not None else None
    demand = read_demand(run, attempt if len(tp.attempts) > 1 else None)
    comps = plan.get("components", [])
    if not demand.series:
        raise SpecError("the run has no action events yet", file=str(run / "events.jsonl"),
                        hint="tune a run that has completed a few iterations")
    predictor = predictor or EWMA()
    steps_all = [demand.steps_per_iteration[i] for i in sorted(demand.steps_per_iteration)]
    steps = statistics.median(_steady(steps_all, skip)) if steps_all else 0.0
    if steps <= 0:
        raise SpecError("the run's events count no env steps or samples per iteration",
                        file=str(run / "events.jsonl"), hint="tune runs whose rollouts report `steps`")
    partition = (plan.get("slurm") or {}).get("partition")
    current, per_step, price, price_new, cpus = [], [], [], [], []
    # Memory from every attempt, not only the fitted one (series.peak_memory says why).
    peaks = peak_memory(run)
    needed = {c["name"]: _needed(run, c, peaks.get(c["name"], 0.0), margin) for c in comps}
    for comp in comps:
        name = comp["name"]
        work = predicted_busy(demand, name, predictor, skip)
        rank_price, gpus = _rank_price(comp, prices, partition)
        sizes = fitted.sizes if fitted is not None and fitted.sizes else demand.ranks
        ranks_run = sizes.get(name, int(comp["ntasks"]))  # in-process: one per component
        current.append(ComponentSize(name, ranks_run, int(comp["cpus_per_task"]), gpus, rank_mem_mb(comp),
                                     work / steps, tasks_per_node=max(1, int(comp.get("tasks_per_node", 1)))))
        per_step.append(work / steps)
        price.append(rank_price)
        cpus.append(int(comp["cpus_per_task"]))
        new_mem = needed[name] or rank_mem_mb(comp)
        price_new.append(_rank_price(comp, prices, partition, new_mem)[0])
    now = tuple(c.ranks for c in current)
    budget = max_cores or sum(n * c for n, c in zip(now, cpus, strict=True))
    best = _search(per_step, price_new, cpus, budget, max_ranks=max(budget, 1))
    pace_now, pace_new = _pace(now, per_step), _pace(best, per_step)
    measured = fitted.steady if fitted is not None and fitted.steady else 0.0
    calibration = measured / pace_now if measured and pace_now > 0 else 1.0
    proposed = []
    for c, n in zip(current, best, strict=True):
        proposed.append(ComponentSize(c.name, n, c.cpus_per_task, c.gpus_per_rank, needed[c.name] or c.mem_mb,
                                      c.busy_s_per_step,
                                      tasks_per_node=c.tasks_per_node,
                                      utilization=c.busy_s_per_step * pace_new / n))
        c.utilization = c.busy_s_per_step * pace_now / c.ranks
    cost_now = _cost_per_m(now, price, pace_now * calibration)
    cost_new = _cost_per_m(best, price_new, pace_new * calibration)
    notes = ["cpus_per_task kept: events do not say how an action scales with threads",
             "gradient all-reduce between added learner ranks is not priced"]
    if len(comps) == 1:
        notes.append("one component: nothing to balance; only memory is resized")
    if fitted is None or fitted.steady is None:
        notes.append("no steady throughput measured yet (too few iterations): the prediction is the "
                     "uncalibrated model's")
    steady_s = steady_seconds(fitted, steps)
    if steady_s is not None and steady_s < SHORT_STEADY_S:
        notes.append(f"the fitted run's steady part lasted {steady_s:.1f} s: two runs of one job this short can "
                     "differ by more than its windows' spread; for a prediction to trust, tune a run with "
                     f"{SHORT_STEADY_S:.0f} s or more of steady iterations")
    decision, reason = "resize", ""
    if not cost_new < cost_now:
        decision = "keep"
        if best == now:
            reason = "the measured rank counts are already the cheapest mix the model finds"
        else:
            mix = ", ".join(f"{p.name}={p.ranks}" for p in proposed)
            reason = (f"the cheapest mix within {budget} cores ({mix}) would cost "
                      f"{cost_new / cost_now - 1:+.1%} per step by the model"
                      + ("" if max_cores is None else "; allow more cores with --max-cores"))
        # Keep the rank counts and the memory asked for, except where a rank measured more
        # than that: a proposal never asks for less than a rank was measured to use.
        raised = []
        for p, c in zip(proposed, current, strict=True):
            p.ranks, p.utilization = c.ranks, c.utilization
            p.mem_mb = max(c.mem_mb, needed[c.name] or 0)
            if p.mem_mb > c.mem_mb:
                raised.append(f"{c.name} {c.mem_mb} -> {p.mem_mb} MB")
        pace_new, cost_new = pace_now, cost_now
        if raised:
            reason += ("; memory raised to the measured peak plus margin (" + ", ".join(raised) + ")")
            cost_new = _cost_per_m(now, [_rank_price(comp, prices, partition, p.mem_mb)[0]
                                         for comp, p in zip(comps, proposed, strict=True)], pace_now * calibration)
    spread = fitted.relative_spread if fitted is not None else None
    if decision == "resize" and spread is not None and 1 - cost_new / cost_now < spread:
        notes.append(f"the predicted cut ({1 - cost_new / cost_now:.1%}) is within the measured windows' "
                     f"spread (+/-{spread:.1%}): it may not show in one run")
    return Proposal(str(run), steps, measured, current, proposed, pace_now, pace_new, cost_now, cost_new,
                    str(prices.get("currency", "USD")), getattr(predictor, "name", "?"), notes,
                    attempt=attempt or 0, unit=tp.unit,
                    measured_spread=fitted.spread if fitted is not None else None,
                    whole_run_steps_per_s=tp.whole_run, calibration=calibration, decision=decision,
                    reason=reason)

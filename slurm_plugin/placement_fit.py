"""``placement: auto`` and ``hetrun submit --fit``: pick each component's partition and
GPU type against the live pool, and record the choice in plan.json.

One pool snapshot (``pool.collect``) for the whole job; each component's
candidates are scored (``placement.score``), re-scored with Slurm's own start
estimate (``sbatch --test-only``, one call per candidate) and the best wins.
The nodes a chosen candidate would use are taken out of the snapshot before
the next component is scored, so two placed components of one job do not both
count on the same free GPUs. A fixed component's request is not taken out: an
auto component may count on nodes a fixed sibling will take (not yet modelled).

``explain`` is the same without choosing: every candidate of every component
(fixed ones too), for ``hetrun plan --explain``; without a cluster it says the
pool is unavailable and shows the derived needs only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetrun.dag.errors import HetrunError, SlurmError, SpecError
from hetrun.dag.needs import ComponentNeed, component_needs

from .placement import Candidate, Need, excluded, score, slurm_test_only, with_start_estimates
from .pool import PoolSnapshot, Runner, collect


@dataclass
class ComponentFit:
    need: ComponentNeed
    candidates: list[Candidate] = field(default_factory=list)  # best first
    excluded: list[str] = field(default_factory=list)  # groups that can never hold it, and why

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


@dataclass
class FitReport:
    components: dict[str, ComponentFit]
    pool_taken_at: float | None = None  # None: no pool (unavailable says why)
    unavailable: str | None = None


def _take(snap: PoolSnapshot, need: Need, nodes: list[str]) -> None:
    """Count ``need`` as allocated on ``nodes`` of the snapshot (for the next component)."""
    chosen = set(nodes)
    for n in snap.nodes:
        if n.name in chosen:
            n.cpus_free -= need.cpus_per_node
            n.gpus_free -= need.gpus_per_node
            n.mem_free_mb -= need.mem_mb_per_node


def fit_components(needs: Mapping[str, ComponentNeed], snap: PoolSnapshot,
                   test_only: Callable[[list[str]], str], names: list[str] | None = None) -> dict[str, ComponentFit]:
    """Candidates of the components in ``names`` (default: all), in het group order."""
    out = {}
    for name, cneed in needs.items():
        if names is not None and name not in names:
            continue
        need = Need.from_needs(cneed)
        cands = with_start_estimates(need, score(need, snap), test_only)
        out[name] = ComponentFit(cneed, cands, excluded(need, snap))
        if cands and cands[0].fits_now:
            _take(snap, need, cands[0].nodes)
    return out


def _snapshot(run: Runner | None, hours: float = 6.0) -> tuple[PoolSnapshot | None, str | None]:
    try:
        return collect(run, hours=hours), None
    except SlurmError as exc:
        return None, str(exc).splitlines()[0]


def explain(spec: Any, *, run: Runner | None = None, test_only: Callable[[list[str]], str] | None = None,
            hours: float = 6.0) -> FitReport:
    """Every component's needs and, when a cluster answers, its candidates (``hours``: the
    pool's failure-history window)."""
    needs = component_needs(spec)
    snap, why = None, None
    if run is None:  # the default cluster: ask quickly whether a controller answers at all
        from .backends import choose_auto

        probe = choose_auto()
        why = None if probe.name == "sbatch" else probe.reason
    if why is None:
        snap, why = _snapshot(run, hours)
    if snap is None:
        return FitReport({n: ComponentFit(c) for n, c in needs.items()}, unavailable=why)
    fits = fit_components(needs, snap, test_only or slurm_test_only())
    return FitReport(fits, snap.taken_at)


def auto_components(spec: Any, fit_all: bool) -> list[str]:
    return [n for n, c in spec.components.items() if fit_all or c.placement == "auto"]


def choose(spec: Any, *, fit_all: bool = False, run: Runner | None = None,
           test_only: Callable[[list[str]], str] | None = None) -> FitReport:
    """The fit of every component to place (``placement: auto``, or all with ``fit_all``).
    Raises ``SlurmError`` without a pool and ``SpecError`` when nothing can hold one."""
    names = auto_components(spec, fit_all)
    snap, why = _snapshot(run)
    if snap is None:
        raise SlurmError(f"placement of {', '.join(names)} needs the pool, and it is unavailable: {why}",
                         hint="start the cluster (hetrun cluster up), or give those components placement: fixed")
    fits = fit_components(component_needs(spec), snap, test_only or slurm_test_only(), names)
    for name, fit in fits.items():
        if fit.best is None:
            raise SpecError(f"no partition / GPU type of the pool can ever hold component {name!r}: "
                            + ("; ".join(fit.excluded) or "the pool has no nodes"),
                            key_path=f"components.{name}",
                            hint="allow more partitions: / gpu_types:, or ask for fewer nodes, CPUs or GPUs")
    return FitReport(fits, snap.taken_at)


def _summary(c: Candidate) -> str:
    start = "" if c.start_in_s is None else f", start in {c.start_in_s:.0f} s"
    return f"{c.partition} {c.gres}: score {c.score:.2f}{start}: " + "; ".join(c.reasons)


def why_lost(c: Candidate, best: Candidate) -> str:
    """One line on why ``c`` lost to ``best`` (the structured differences first)."""
    parts = []
    if best.fits_now and not c.fits_now:
        parts.append("it cannot start now (not enough free nodes)")
    if c.start_in_s is None and best.start_in_s is not None:
        parts.append("Slurm gives it no start time")
    elif c.start_in_s is not None and best.start_in_s is not None and c.start_in_s > best.start_in_s:
        parts.append(f"Slurm expects it to start {c.start_in_s - best.start_in_s:.0f} s later")
    if c.score == best.score:
        parts.append(f"same score; {best.partition} {best.gres} comes first by name")
    else:
        parts.append(f"{best.score - c.score:.2f} points lower")
    return "; ".join(parts)


def _need_line(name: str, n: ComponentNeed) -> str:
    gpu_mem = f", {n.gpu_mem_mb_per_gpu} MB per GPU" if n.gpu_mem_mb_per_gpu else ""
    return (f"component {name} (placement {n.placement}): {n.nodes} node(s) x {n.cpus_per_node} CPUs, "
            f"{n.gpus_per_node} GPUs{gpu_mem}, {n.mem_mb_per_node} MB per node")


def explain_lines(report: FitReport) -> list[str]:
    """``hetrun plan --explain``'s placement section: needs, then candidates best first."""
    if report.pool_taken_at is None:
        head = f"placement: the pool is unavailable ({report.unavailable}); the needs alone:"
    else:
        head = f"placement against the pool at {time.strftime('%H:%M:%S', time.localtime(report.pool_taken_at))}:"
    out = [head]
    for name, fit in report.components.items():
        n = fit.need
        out.append(_need_line(name, n))
        out += [f"  derived from {d}" for d in n.derived]
        out.append(f"  allowed: partitions {', '.join(n.partitions) or 'any'}; GPU types "
                   f"{', '.join(n.gpu_types) or 'any'}")
        out.append("  network: " + ("; ".join(n.network) or "nothing across nodes"))
        if report.pool_taken_at is None:
            continue
        best = fit.best
        if best is None:
            out.append("  no candidate: no partition / GPU type of this pool can ever hold it")
        for i, c in enumerate(fit.candidates):
            start = "no start time" if c.start_in_s is None else f"start in {c.start_in_s:.0f} s"
            out.append(f"  {'best' if i == 0 else 'lost'} {c.partition} {c.gres}: score {c.score:.2f}, {start}; "
                       + "; ".join(c.reasons))
            if i and best is not None:
                out.append(f"       lost because {why_lost(c, best)}")
        out += [f"  out  {x}" for x in fit.excluded]
    return out


def record(plan_d: dict[str, Any], report: FitReport) -> None:
    """Each placed component's choice into ``plan_d`` (plan.json), for the script and for reports."""
    from hetrun.dag.plan import PlacementChoice

    for comp in plan_d["components"]:
        fit = report.components.get(comp["name"])
        if fit is None or fit.best is None:
            continue
        best = fit.best
        choice = PlacementChoice(partition=best.partition, gres=best.gres, score=best.score,
                                 start_in_s=best.start_in_s, nodes=list(best.nodes), reasons=list(best.reasons),
                                 others=[_summary(c) for c in fit.candidates[1:]] + fit.excluded,
                                 pool_taken_at=report.pool_taken_at or time.time())
        comp["placement"] = choice.model_dump(mode="json")


def place(spec: Any, plan_d: dict[str, Any], backend: Any, *, fit_all: bool = False) -> FitReport | None:
    """The fit step of ``hetrun submit``: place the ``placement: auto`` components (every one
    with ``fit_all``) on ``backend``'s cluster and record the choices in ``plan_d``.
    Nothing to do (None) when no component asks for it."""
    if not auto_components(spec, fit_all):
        return None
    if backend.name == "local":
        if fit_all:
            raise HetrunError("--fit places components on a Slurm cluster's pool; the local backend has none",
                              hint="submit with --backend sbatch, or leave --fit out")
        return None  # placement: auto on this machine: there is only one place
    run, test_only = with_runner_env(getattr(backend, "env", None))
    report = choose(spec, fit_all=fit_all, run=run, test_only=test_only)
    record(plan_d, report)
    return report


def with_runner_env(env: Mapping[str, str] | None) -> tuple[Runner | None, Callable[[list[str]], str]]:
    """The pool runner and the ``sbatch --test-only`` caller for a cluster reached through ``env``
    (None: the default cluster)."""
    if env is None:
        return None, slurm_test_only()
    from .backends.slurm_cli import run_slurm

    def run(argv: Any) -> str:
        return run_slurm(list(argv), env=env).stdout

    return run, slurm_test_only(dict(env))


__all__ = ["ComponentFit", "FitReport", "auto_components", "choose", "explain", "explain_lines", "fit_components", "place", "record",
           "with_runner_env"]

"""``placement: auto`` and ``hetrun submit --fit``: pick each component's partition,
GPU type and (with ``node_counts:``) node count against the live pool, and record
the choice in plan.json.

One pool snapshot (``pool.collect``) and the submitter's quotas (``quota.read_quotas``)
for the whole job. The job's fixed components come first: they are in the same
het job, so the nodes Slurm would give them (their best-scored group's free
nodes) and their TRES are counted as taken before any auto component is scored.
Then each auto component's candidates (every allowed node count) are scored
(``placement.score``), re-scored with Slurm's own start estimate
(``sbatch --test-only``, one call per candidate) and the best wins; its nodes
and TRES are taken before the next component is scored, so two components of
one job do not both count on the same free GPUs or the same quota.

``explain`` is the same without choosing: every candidate of every component
(fixed ones too), for ``hetrun plan --explain``; without a cluster it says the
pool is unavailable and shows the derived needs only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hetrun.dag.needs import ComponentNeed, component_needs
from hetrun.dag.spec import PLACED_MODES

from hetrun.errors import HetrunError, SlurmError, SpecError

from .placement import (
    Candidate,
    Need,
    excluded,
    need_tres,
    rank_key,
    score,
    slurm_test_only,
    with_start_estimates,
)
from .pool import PoolSnapshot, Runner, collect
from .quota import Quotas, label, read_quotas
from .quota import check as check_quota

if TYPE_CHECKING:
    from hetrun.dag.plan import ComponentPlan, PlacementChoice, Plan
    from hetrun.dag.spec import JobSpec

    from .backends import BackendChoice
    from .backends.base import Backend

# A candidate over a quota with what runs now, where no candidate is inside the quotas:
# below any candidate that fits now, so it wins only among candidates that all wait.
QUOTA_WAIT_PENALTY = 150.0


@dataclass
class ComponentFit:
    need: ComponentNeed
    candidates: list[Candidate] = field(default_factory=list)  # best first
    excluded: list[str] = field(default_factory=list)  # groups that can never hold it, and why
    # Every GRES group of each partition in the pool ("gpu:a100", "-"): ranked's untyped gpu:N
    # may land on any of them, so it checks them all (empty: not known, the candidates are trusted).
    pool_gres: dict[str, set[str]] = field(default_factory=dict)

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


@dataclass
class FitReport:
    components: dict[str, ComponentFit]
    pool_taken_at: float | None = None  # None: no pool (unavailable says why)
    unavailable: str | None = None
    quotas: Quotas | None = None  # the submitter's limits as read (None: not read)


def _take(snap: PoolSnapshot, need: Need, nodes: list[str]) -> None:
    """Count ``need`` as allocated on ``nodes`` of the snapshot (for the next component)."""
    chosen = set(nodes)
    for n in snap.nodes:
        if n.name in chosen:
            n.cpus_free -= need.cpus_per_node
            n.gpus_free -= need.gpus_per_node
            n.mem_free_mb -= need.mem_mb_per_node


def _take_best(snap: PoolSnapshot, quotas: Quotas | None, shapes: list[Need], best: Candidate | None,
               names_nodes: bool = True) -> None:
    """The component as placed on ``best`` (or, with no candidate, as asked) is counted as taken:
    its nodes when it fits now, the nodes it names when it starts by preemption (a sibling does
    not name them too; a fixed component names none: ``names_nodes``), its TRES under every
    quota (they count once the het job starts)."""
    need = next((s for s in shapes if not best or not best.node_count or s.nodes == best.node_count), shapes[0])
    if best is not None and best.fits_now:
        _take(snap, need, best.nodes)
    elif best is not None and best.preempt_nodes and names_nodes:
        snap.claimed = tuple(sorted({*snap.claimed, *best.preempt_nodes}))
    if quotas is not None:
        quotas.take(need_tres(need, best.gres if best else ("gpu" if need.gpus_per_node else "-")))


def _candidates(shapes: list[Need], snap: PoolSnapshot, quotas: Quotas | None,
                test_only: Callable[[list[str]], str] | None) -> tuple[list[Candidate], list[str]]:
    """Every shape's candidates best first (with Slurm's start estimate unless ``test_only`` is None),
    and the groups that can never hold a shape."""
    cands, out = [], []
    for need in shapes:
        scored, why_out = _within_quota(need, snap, quotas)
        cands += scored if test_only is None else with_start_estimates(need, scored, test_only)
        out += why_out
    return sorted(cands, key=rank_key), out


def _within_quota(need: Need, snap: PoolSnapshot, quotas: Quotas | None) -> tuple[list[Candidate], list[str]]:
    """``need``'s candidates inside the quotas. Where every one is over a quota only because of
    what runs now, Slurm would queue the job until the quota frees (AssocGrpGRES and the like),
    so those still go, last and waiting; a job over a limit on its own is out for good."""
    scored = score(need, snap, quotas)
    if scored or quotas is None or not quotas.limits:
        return scored, excluded(need, snap, quotas)
    alone = quotas.alone()
    waiting = score(need, snap, alone)
    for c in waiting:
        why = check_quota(quotas, need_tres(need, c.gres))[0]
        c.score, c.fits_now, c.nodes = round(c.score - QUOTA_WAIT_PENALTY, 2), False, []
        c.reasons.append(f"{why}: Slurm holds it until the quota frees")
    return waiting, excluded(need, snap, alone)


def fit_components(needs: Mapping[str, ComponentNeed], snap: PoolSnapshot,
                   test_only: Callable[[list[str]], str] | None, names: list[str] | None = None,
                   quotas: Quotas | None = None) -> dict[str, ComponentFit]:
    """Candidates of the components in ``names`` (default: all), in het group order. The fixed
    components not among ``names`` are counted as taken first (the job's own siblings).
    ``test_only`` None: without Slurm's start estimate (the score alone)."""
    placed = [n for n in needs if names is None or n in names]
    fixed = [n for n, c in needs.items() if c.placement not in PLACED_MODES and n not in (names or ())]
    fits = {}
    pool_gres: dict[str, set[str]] = {}
    for row in snap.rows:
        pool_gres.setdefault(row.partition, set()).add(row.gres)
    for name in fixed + [n for n in placed if n not in fixed]:
        shapes = Need.shapes(needs[name])
        if quotas is not None and quotas.preempts:  # where it must wait, placement counts the work lost
            shapes = [replace(s, preempts=quotas.preempts, stops_clean=quotas.stops_clean) for s in shapes]
        if name in fixed:  # where Slurm would put it: its best group now, before any estimate
            cands, out = _candidates(shapes, snap, quotas, None)
            _take_best(snap, quotas, shapes, cands[0] if cands else None, names_nodes=False)
            if name in placed:  # explain shows it, with Slurm's estimates too
                shown = cands if test_only is None else with_start_estimates(shapes[0], cands, test_only)
                fits[name] = ComponentFit(needs[name], shown, out, pool_gres)
            continue
        cands, out = _candidates(shapes, snap, quotas, test_only)
        fits[name] = ComponentFit(needs[name], cands, out, pool_gres)
        _take_best(snap, quotas, shapes, fits[name].best)
    return {n: fits[n] for n in placed}


def _snapshot(run: Runner | None, spec: JobSpec, hours: float = 6.0) -> tuple[PoolSnapshot | None, Quotas | None,
                                                                           str | None]:
    """The pool and the submitter's quotas (account / QOS as the job's slurm: section names them)."""
    try:
        snap = collect(run, hours=hours)
    except SlurmError as exc:
        return None, None, str(exc).splitlines()[0]
    quotas = read_quotas(run or _default_runner, snap.running_use, account=spec.slurm.account,
                         qos=spec.slurm.qos)
    return snap, quotas, None


def _default_runner(argv: Sequence[str]) -> str:
    from .backends.slurm_cli import run_slurm

    return run_slurm(list(argv)).stdout


def explain(spec: JobSpec, *, run: Runner | None = None, test_only: Callable[[list[str]], str] | None = None,
            hours: float = 6.0, probe: BackendChoice | None = None) -> FitReport:
    """Every component's needs and, when a cluster answers, its candidates (``hours``: the
    pool's failure-history window; ``probe``: the caller's ``choose_auto()``, if it asked)."""
    needs = component_needs(spec)
    snap, quotas, why = None, None, None
    if run is None:  # the default cluster: ask quickly whether a controller answers at all
        from .backends import choose_auto

        probe = probe or choose_auto()
        why = None if probe.name == "sbatch" else probe.reason
    if why is None:
        snap, quotas, why = _snapshot(run, spec, hours)
    if snap is None:
        return FitReport({n: ComponentFit(c) for n, c in needs.items()}, unavailable=why)
    fits = fit_components(needs, snap, test_only or slurm_test_only(), quotas=quotas)
    return FitReport(fits, snap.taken_at, quotas=quotas)


def auto_components(spec: JobSpec, fit_all: bool) -> list[str]:
    return [n for n, c in spec.components.items() if fit_all or c.placement in PLACED_MODES]


def choose(spec: JobSpec, *, fit_all: bool = False, run: Runner | None = None,
           test_only: Callable[[list[str]], str] | None = None) -> FitReport:
    """The fit of every component to place (``placement: auto``, or all with ``fit_all``).
    Raises ``SlurmError`` without a pool and ``SpecError`` when nothing can hold one."""
    names = auto_components(spec, fit_all)
    snap, quotas, why = _snapshot(run, spec)
    if snap is None:
        raise SlurmError(f"placement of {', '.join(names)} needs the pool, and it is unavailable: {why}",
                         hint="start the cluster (hetrun cluster up), or give those components placement: fixed")
    fits = fit_components(component_needs(spec), snap, test_only or slurm_test_only(), names, quotas)
    for name, fit in fits.items():
        if fit.best is None:
            raise SpecError(f"no partition / GPU type of the pool can ever hold component {name!r} (or it "
                            "would exceed a quota): " + ("; ".join(fit.excluded) or "the pool has no nodes"),
                            key_path=f"components.{name}",
                            hint="allow more partitions: / gpu_types: / node_counts:, ask for fewer nodes, CPUs "
                                 "or GPUs, or wait until jobs over the quota named end")
    return FitReport(fits, snap.taken_at, quotas=quotas)


def _summary(c: Candidate) -> str:
    start = "" if c.start_in_s is None else f", start in {c.start_in_s:.0f} s"
    return f"{c.label}: score {c.score:.2f}{start}: " + "; ".join(c.reasons)


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
        parts.append(f"same score; {best.label} comes first by name")
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
    out = [head, *quota_lines(report.quotas)]
    for name, fit in report.components.items():
        n = fit.need
        out.append(_need_line(name, n))
        out += [f"  derived from {d}" for d in n.derived]
        out.append(f"  allowed: partitions {', '.join(n.partitions) or 'any'}; GPU types "
                   f"{', '.join(n.gpu_types) or 'any'}"
                   + (f"; node counts {', '.join(map(str, n.node_counts))}" if n.node_counts else ""))
        out.append("  network: " + ("; ".join(n.network) or "nothing across nodes"))
        if report.pool_taken_at is None:
            continue
        best = fit.best
        if best is None:
            out.append("  no candidate: no partition / GPU type of this pool can ever hold it")
        for i, c in enumerate(fit.candidates):
            start = "no start time" if c.start_in_s is None else f"start in {c.start_in_s:.0f} s"
            out.append(f"  {'best' if i == 0 else 'lost'} {c.label}: score {c.score:.2f}, {start}; "
                       + "; ".join(c.reasons))
            if i and best is not None:
                out.append(f"       lost because {why_lost(c, best)}")
        out += [f"  out  {x}" for x in fit.excluded]
        if n.placement == "ranked" and best is not None:
            gpus = _best_shape(fit).gpus_per_node  # the chosen node count's shape, as the script asks
            ranked = ranked_list(fit.candidates, bool(gpus), fit.pool_gres)
            out.append(f"  ranked: Slurm is handed --partition={','.join(ranked.partitions)}"
                       + (f" --gres={ranked.gres}:{gpus}" if gpus else "")
                       + (f" --nodelist={','.join(ranked.nodelist)}" if ranked.nodelist else ""))
    return out


def quota_lines(quotas: Quotas | None) -> list[str]:
    """The submitter's limits and what the pool's running jobs hold of them (none: not read)."""
    if quotas is None:
        return []
    who = f"quota: user {quotas.user}, account {quotas.account or '?'}, QOS {quotas.qos or '?'}"
    if quotas.unavailable:
        return [f"{who}: not read ({quotas.unavailable}); not checked"]
    notes = [f"  {n}" for n in quotas.notes]
    if not quotas.limits:
        return [f"{who}: no limits", *notes]
    return [f"{who}:"] + [f"  {lim.scope}: " + ", ".join(f"{lim.used.get(k, 0)} of {n} {label(k)}"
                                                        for k, n in sorted(lim.limits.items()))
                          + " in use" for lim in quotas.limits] + notes


def _spread(comp: ComponentPlan, count: int) -> dict[str, int]:
    """The plan's component spread over ``count`` nodes, as the het block will ask for it
    (the fields that change; none when ``count`` is its own node count)."""
    from hetrun.dag.needs import split_over

    if count == comp.nodes:
        return {}
    tpn, gpn, mem = split_over(comp.nodes, comp.tasks_per_node, comp.gpus_per_node, comp.mem_mb, count)
    return {"nodes": count, "tasks_per_node": tpn, "gpus_per_node": gpn, "mem_mb": mem}


@dataclass(frozen=True)
class RankedList:
    """``placement: ranked``: what Slurm is handed for one component."""

    partitions: list[str]  # best first, each once: --partition=a,b
    gres: str  # the kept candidates' shared GRES group ("gpu:a100"), else untyped "gpu" ("-": no GPUs)
    dropped: int  # candidates left out (``left`` says why)
    left: dict[str, str] = field(default_factory=dict, compare=False)  # candidate label -> why left out
    # Where the best must start by preemption: its victims' nodes (``--nodelist``), the best's
    # partition alone (placement.preemption_plan); empty: Slurm picks the nodes.
    nodelist: list[str] = field(default_factory=list)


def left_out(c: Candidate, best: Candidate, gpus: bool) -> str | None:
    """Why ranked leaves candidate ``c`` out of the list ``best`` heads (None: it is kept). One
    request has one node count; CPU-only work lists GPU nodes only where they score best, so
    it does not queue up on GPU nodes behind GPU work."""
    if c.node_count != best.node_count:
        return f"another node count than the best ({best.node_count})"
    if c is not best and not gpus and c.gres != "-":
        return "GPU nodes for CPU-only work (listed only when they score best)"
    return None


def _unsafe_for_untyped(kept: list[Candidate], candidates: list[Candidate],
                        pool_gres: Mapping[str, set[str]]) -> dict[str, str]:
    """Kept partitions an untyped ``gpu:N`` is not safe on: the partition also holds a GPU group
    that is no candidate for this shape (a type ``gpu_types:`` or GPU memory rules out), and
    Slurm could start the job there. Partition -> why."""
    ok = {(c.partition, c.gres) for c in candidates if c.node_count == kept[0].node_count}
    out = {}
    for part in dict.fromkeys(c.partition for c in kept):
        bad = sorted(g for g in pool_gres.get(part, ()) if g != "-" and (part, g) not in ok)
        if bad:
            out[part] = (f"{part} also holds {', '.join(g.partition(':')[2] or g for g in bad)}, which the "
                         "component does not accept (an untyped GRES could land there)")
    return out


def ranked_list(candidates: list[Candidate], gpus: bool,
                pool_gres: Mapping[str, set[str]] | None = None) -> RankedList:
    """The kept candidates (best first) as one multi-partition request; Slurm starts such a job in
    whichever partition lets it start first. The GRES is typed when every kept candidate has that
    type; else untyped ``gpu``, only over partitions whose every GPU group (``pool_gres``, the
    pool's GRES groups per partition; None: not known) the component accepts; where that leaves
    one type, or the best's own partition is not safe, the best's typed GRES and its type's
    candidates."""
    best = candidates[0]
    if not best.fits_now and best.preempt_nodes:
        # A start by preemption: the jobs that lose least, named by their nodes in the best's
        # partition, where a list would let Slurm preempt its own pick (the smallest jobs of
        # the lowest QOS, whatever they have run) in whichever partition it tries first.
        why = f"{best.label} starts by preempting the jobs that lose least there, named by their nodes"
        return RankedList([best.partition], best.gres, len(candidates) - 1,
                          {c.label: why for c in candidates[1:]}, list(best.preempt_nodes))
    left = {c.label: why for c in candidates if (why := left_out(c, best, gpus))}
    kept = [c for c in candidates if c.label not in left]
    if gpus and len({c.gres for c in kept}) > 1 and pool_gres:
        unsafe = _unsafe_for_untyped(kept, candidates, pool_gres)
        safe = [c for c in kept if c.partition not in unsafe]
        if best.partition in unsafe or len({c.gres for c in safe}) == 1:  # the best's type, typed
            why = f"another GPU type than the best's {best.gres}, kept typed since " + "; ".join(unsafe.values())
            left.update({c.label: why for c in kept if c.gres != best.gres})
        else:
            left.update({c.label: why for c in kept if (why := unsafe.get(c.partition))})
        kept = [c for c in kept if c.label not in left]
    groups = {c.gres for c in kept}
    gres = groups.pop() if len(groups) == 1 else ("gpu" if gpus else "-")
    return RankedList(list(dict.fromkeys(c.partition for c in kept)), gres, len(candidates) - len(kept), left)


def _best_shape(fit: ComponentFit) -> Need:
    """The shape of the node count the best candidate stands for (the component's own without
    ``node_counts:``): one GPU count for ``--explain`` and the plan.json record alike."""
    shapes = Need.shapes(fit.need)
    best = fit.best
    return next((s for s in shapes if best is not None and best.node_count and s.nodes == best.node_count),
                shapes[0])


def _choice(fit: ComponentFit, pool_taken_at: float) -> PlacementChoice:
    """The plan.json ``placement`` record of one placed component (``ranked``: its list too)."""
    from hetrun.dag.plan import PlacementChoice

    best = fit.best
    assert best is not None
    gres, reasons, ranked = best.gres, list(best.reasons), None
    others = [f"{_summary(c)}; lost because {why_lost(c, best)}" for c in fit.candidates[1:]]
    # A start by preemption names its victims (placement.preemption_plan), ranked or not.
    nodelist = [] if best.fits_now else list(best.preempt_nodes)
    if nodelist:
        reasons.append(f"starts by preemption on {','.join(nodelist)}: the jobs there lose least, and Slurm "
                       "is handed those nodes (--nodelist) rather than left to pick the smallest jobs")
    if fit.need.placement == "ranked":
        ranked = ranked_list(fit.candidates, bool(_best_shape(fit).gpus_per_node), fit.pool_gres)
        gres = ranked.gres
        reasons.append(f"ranked: Slurm is handed {','.join(ranked.partitions)} best first and starts it in the "
                       "first that lets it start" + (f"; {ranked.dropped} candidate(s) left out" if ranked.dropped
                                                     else ""))
        others = [f"{_summary(c)}; " + (f"left out: {why}" if (why := ranked.left.get(c.label)) else
                                        "in the ranked list") for c in fit.candidates[1:]]
    return PlacementChoice(partition=best.partition, gres=gres, score=best.score, start_in_s=best.start_in_s,
                           nodes=list(best.nodes), reasons=reasons, others=others + fit.excluded,
                           pool_taken_at=pool_taken_at, node_count=best.node_count or None,
                           ranked=ranked.partitions if ranked else [], nodelist=nodelist)


def record(plan: Plan, report: FitReport) -> Plan:
    """``plan`` with each placed component's choice (and, with ``node_counts:``, its spread shape)
    recorded, for the script and for reports (plan.json ``components[i].placement``)."""
    comps = []
    for comp in plan.components:
        fit = report.components.get(comp.name)
        if fit is not None and fit.best is not None:
            choice = _choice(fit, report.pool_taken_at or time.time())
            shape = _spread(comp, fit.best.node_count) if fit.best.node_count else {}
            comp = comp.model_copy(update={**shape, "placement": choice})
        comps.append(comp)
    return plan.model_copy(update={"components": comps})


def place(spec: JobSpec, plan: Plan, backend: Backend, *, fit_all: bool = False) -> Plan:
    """The fit step of ``hetrun submit``: ``plan`` with the ``placement: auto`` components (every
    one with ``fit_all``) placed on ``backend``'s cluster; ``plan`` itself when no component asks
    for it (or the local backend, which has one place)."""
    if not auto_components(spec, fit_all):
        return plan
    if backend.name == "local":
        if fit_all:
            raise HetrunError("--fit places components on a Slurm cluster's pool; the local backend has none",
                              hint="submit with --backend sbatch, or leave --fit out")
        return plan  # placement: auto on this machine: there is only one place
    run, test_only = with_runner_env(getattr(backend, "env", None))
    return record(plan, choose(spec, fit_all=fit_all, run=run, test_only=test_only))


def with_runner_env(env: Mapping[str, str] | None) -> tuple[Runner | None, Callable[[list[str]], str]]:
    """The pool runner and the ``sbatch --test-only`` caller for a cluster reached through ``env``
    (None: the default cluster)."""
    if env is None:
        return None, slurm_test_only()
    from .backends.sbatch import SACCT_TIME_ENV
    from .backends.slurm_cli import run_slurm

    pool_env = {**env, **SACCT_TIME_ENV}  # the pool's sacct times as ISO 8601

    def run(argv: Sequence[str]) -> str:
        return run_slurm(list(argv), env=pool_env).stdout

    return run, slurm_test_only(dict(env))


__all__ = ["ComponentFit", "FitReport", "RankedList", "auto_components", "choose", "explain", "explain_lines",
           "fit_components", "left_out", "place", "quota_lines", "ranked_list", "record", "with_runner_env"]

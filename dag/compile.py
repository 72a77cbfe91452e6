"""Compiler passes over the per-iteration template, each reporting before/after.

1. ``split_micro``: forward/backward become one part per micro-batch
   (``forward.m0`` ...); parts of different micro-batches are independent, and
   everything that consumed the whole (``sync.grads``) waits for all parts.
2. ``order_memory``: 1F1B-style ordering. Left alone, every forward part could
   run before the first backward, holding all micro-batches' activations at
   once; memory deps ``forward.m(j+k) after backward.m(j)`` cap the in-flight
   micro-batches at k (``schedule.max_inflight_micro``, lowered to what fits).
3. ``fuse``: an action whose only consumer is the next action on the same
   component, which waits for nothing else, runs with it in one dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrun.dag.action import ActionGraph, Dep, TrainingAction
from hetrun.dag.spec import JobSpec

from hetrun.errors import GraphError

SPLIT_TYPES = ("forward", "backward")


@dataclass
class PassReport:
    """What one pass did, for ``hetrun plan --explain``."""

    name: str
    summary: str
    before: list[str]
    after: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass
class MemoryEstimate:
    component: str
    resource: str  # "memory" or "gpu_memory"
    budget_mb: int | None
    model_state_mb: int
    activation_mb: int
    inflight_before: int
    inflight_after: int

    @property
    def peak_before_mb(self) -> int:
        return self.model_state_mb + self.inflight_before * self.activation_mb

    @property
    def peak_after_mb(self) -> int:
        return self.model_state_mb + self.inflight_after * self.activation_mb


def describe(graph: ActionGraph) -> list[str]:
    """One line per action: ``id [component] <- deps`` (lagged deps as ``id@-k``)."""
    lines = []
    for a in graph:
        deps = ", ".join(d.id if d.lag == 0 else f"{d.id}@-{d.lag}" for d in a.deps)
        extra = f" (fuses {' + '.join(a.fused)})" if a.fused else ""
        lines.append(f"{a.id} [{a.component}] <- {deps or '-'}{extra}")
    return lines


def split_micro(graph: ActionGraph, micro_batches: int) -> tuple[ActionGraph, PassReport]:
    before = describe(graph)
    parts = {a.id: [f"{a.id}.m{j}" for j in range(micro_batches)]
             for a in graph if a.action_type in SPLIT_TYPES and a.micro is None}

    def remap(dep: Dep, micro: int | None) -> list[Dep]:
        if dep.id not in parts:
            return [dep]
        if micro is not None and dep.lag == 0:
            return [Dep(parts[dep.id][micro], 0, dep.kind)]
        return [Dep(p, dep.lag, dep.kind) for p in parts[dep.id]]

    out = ActionGraph()
    for a in graph:
        if a.id in parts:
            for j, pid in enumerate(parts[a.id]):
                deps = [nd for d in a.deps for nd in remap(d, j)]
                out.add(TrainingAction(pid, a.action_type, a.component, a.resource_profile, deps,
                                       a.tolerance_window, a.qos, j, a.every))
        else:
            deps = [nd for d in a.deps for nd in remap(d, None)]
            out.add(TrainingAction(a.id, a.action_type, a.component, a.resource_profile, deps,
                                   a.tolerance_window, a.qos, a.micro, a.every, list(a.fused)))
    report = PassReport("split", f"forward/backward split into {micro_batches} micro-batch parts, "
                        "merged before sync.grads", before, describe(out))
    return out, report


def order_memory(graph: ActionGraph, spec: JobSpec) -> tuple[ActionGraph, PassReport, MemoryEstimate | None]:
    before = describe(graph)
    forwards = sorted((a for a in graph if a.action_type == "forward" and a.micro is not None),
                      key=lambda a: a.micro or 0)
    if not forwards:
        return graph, PassReport("memory", "no micro-batched forward; nothing to order", before, before), None
    cname = forwards[0].component
    comp = spec.components[cname]
    use_gpu = comp.gpus_per_node > 0 and comp.gpu_mem_per_task_mb is not None
    resource = "gpu_memory" if use_gpu else "memory"

    def mem(a: TrainingAction) -> int:
        return a.resource_profile.gpu_memory_mb if use_gpu else a.resource_profile.memory_mb

    budget = comp.gpu_mem_per_task_mb if use_gpu else comp.mem_per_task_mb
    state = mem(graph["optimize"]) if "optimize" in graph and graph["optimize"].component == cname else 0
    act = max(mem(a) for a in forwards)
    n = len(forwards)
    k = min(spec.schedule.max_inflight_micro, n)
    notes = []
    if budget is not None and act > 0:
        fit = (budget - state) // act
        if fit < 1:
            raise GraphError(
                f"component {cname!r}: one micro-batch's activations ({act} MB) plus the model state "
                f"({state} MB) exceed the {budget} MB of {resource} per rank",
                hint=f"raise components.{cname}.mem, lower actions.forward.{resource}, "
                     "or raise training.micro_batches")
        if fit < k:
            notes.append(f"max_inflight_micro {k} lowered to {fit}: only {fit} micro-batches' "
                         f"activations fit in {budget} MB")
            k = fit
    out = graph.copy()
    backwards = {a.micro: a.id for a in out if a.action_type == "backward" and a.component == cname}
    for a in out:
        if a.action_type == "forward" and a.micro is not None and a.micro >= k:
            gate = backwards.get(a.micro - k)
            if gate is not None:
                a.deps.append(Dep(gate, 0, "memory"))
    est = MemoryEstimate(cname, resource, budget, state, act, n, k)
    summary = (f"1F1B on {cname}: at most {k} of {n} micro-batches in flight; peak {resource} per rank "
               f"{est.peak_before_mb} MB -> {est.peak_after_mb} MB"
               + (f" (budget {budget} MB)" if budget is not None else " (no budget given)"))
    return out, PassReport("memory", summary, before, describe(out), notes), est


def fuse(graph: ActionGraph) -> tuple[ActionGraph, PassReport]:
    """Merge chains A -> B where B waits only for A and A feeds only B, on one component."""
    before = describe(graph)
    consumers = graph.consumers()
    absorbed: dict[str, str] = {}  # member id -> head id of its chain
    chains: dict[str, list[TrainingAction]] = {}
    for a in graph:
        head = absorbed.get(a.id, a.id)
        chain = chains.setdefault(head, [a])
        cons = consumers[a.id]
        if len(cons) != 1:
            continue
        b_id, dep = cons[0]
        b = graph[b_id]
        if (dep.lag == 0 and len(b.deps) == 1 and b.component == a.component
                and b.every == a.every and b_id not in chains):
            absorbed[b_id] = head
            chain.append(b)
    out = ActionGraph()
    new_id = {}
    for head, chain in chains.items():
        fid = "+".join(x.id for x in chain) if len(chain) > 1 else head
        for x in chain:
            new_id[x.id] = fid
    for head, chain in chains.items():
        first = chain[0]
        prof = first.resource_profile
        for x in chain[1:]:
            prof = prof.merged(x.resource_profile)
        deps = [Dep(new_id[d.id], d.lag, d.kind) for d in first.deps]
        qos_rank = ("low", "normal", "high", "critical")
        out.add(TrainingAction(
            id=new_id[head], action_type=first.action_type, component=first.component,
            resource_profile=prof, deps=deps,
            tolerance_window=min(x.tolerance_window for x in chain),
            qos=max((x.qos for x in chain), key=qos_rank.index), micro=first.micro, every=first.every,
            fused=[x.id for x in chain] if len(chain) > 1 else [],
        ))
    n_fused = sum(1 for c in chains.values() if len(c) > 1)
    report = PassReport("fuse", f"{len(graph)} actions -> {len(out)} dispatches ({n_fused} fused)",
                        before, describe(out))
    return out, report


def compile_template(graph: ActionGraph, spec: JobSpec) -> tuple[ActionGraph, list[PassReport], MemoryEstimate | None]:
    """Run the three passes in order; the input graph must already be valid."""
    graph.validate()
    g1, r1 = split_micro(graph, spec.training.micro_batches)
    g2, r2, est = order_memory(g1, spec)
    g3, r3 = fuse(g2)
    g3.validate()
    return g3, [r1, r2, r3], est

"""Unroll the per-iteration template over iterations (and ranks), then schedule it.

The plan stores one iteration; the runtime executes it again and again. For
display (``hetrun plan --unroll N``) and for scale checks we materialize the
graph over a window of iterations, either one node per dispatch (component
level) or one node per dispatch *per rank* (what really runs on a 4096-GPU
job). Cross-iteration deps (``lag``) become real edges inside the window;
deps that point before the window are taken as done.

Rank mapping of an edge: on the same component rank r waits for rank r (a
collective's cross-rank wait happens inside the collective); across
components rank r of the consumer waits for its block of producer ranks
(``r*P//C`` up to ``(r+1)*P//C``), so edges stay O(max(P, C)), not O(P*C).

Kept to flat int lists and a heap of ints: this is the hot path measured by
benchmarks/plan_scale.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from hetrun.dag.errors import GraphError
from hetrun.dag.plan import Plan


@dataclass
class UnrolledGraph:
    template_ids: list[str]
    node_tpl: list[int]  # node -> template action index
    node_iter: list[int]
    node_rank: list[int]  # rank within the component; -1 at component level
    succ: list[list[int]]
    indeg: list[int]
    n_edges: int

    def __len__(self) -> int:
        return len(self.node_tpl)

    def name(self, node: int) -> str:
        base = f"i{self.node_iter[node]}/{self.template_ids[self.node_tpl[node]]}"
        rank = self.node_rank[node]
        return base if rank < 0 else f"{base}@r{rank}"


def unroll(plan: Plan, iterations: int, *, per_rank: bool = False, start: int = 0) -> UnrolledGraph:
    """Iterations ``start .. start+iterations-1`` of ``plan`` as one explicit graph."""
    if iterations < 1:
        raise GraphError(f"cannot unroll {iterations} iterations; expected at least 1")
    actions = plan.actions
    index = {a.id: i for i, a in enumerate(actions)}
    sizes = {c.name: (c.ntasks if per_rank else 1) for c in plan.components}
    width = [sizes[a.component] for a in actions]
    dep_lists = [[(index[d.id], d.lag) for d in a.deps] for a in actions]
    every = [a.every for a in actions]

    node_tpl: list[int] = []
    node_iter: list[int] = []
    node_rank: list[int] = []
    base: dict[tuple[int, int], int] = {}  # (iteration, template index) -> first node
    ranks_of = {w: list(range(w)) if per_rank else [-1] for w in set(width)}
    for it in range(start, start + iterations):
        for t in range(len(actions)):
            if (it + 1) % every[t]:
                continue
            w = width[t]
            base[(it, t)] = len(node_tpl)
            node_tpl.extend([t] * w)
            node_iter.extend([it] * w)
            node_rank.extend(ranks_of[w])

    n = len(node_tpl)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    n_edges = 0
    for (it, t), b in base.items():
        w = width[t]
        for d, lag in dep_lists[t]:
            src = base.get((it - lag, d))
            if src is None:
                continue  # before the window, or an iteration where d does not run
            wd = width[d]
            if wd == w:
                for r in range(w):
                    succ[src + r].append(b + r)
                    indeg[b + r] += 1
                n_edges += w
            else:
                for r in range(w):
                    lo = r * wd // w
                    hi = max(lo + 1, (r + 1) * wd // w)
                    for p in range(lo, hi):
                        succ[src + p].append(b + r)
                    indeg[b + r] += hi - lo
                    n_edges += hi - lo
    return UnrolledGraph([a.id for a in actions], node_tpl, node_iter, node_rank, succ, indeg, n_edges)


def schedule_order(graph: UnrolledGraph, priorities: Sequence[float]) -> list[int]:
    """Topological order, highest template priority first, then earlier iteration/rank.

    Heap-based Kahn over int keys: O(E log V). ``priorities`` is per template action.
    """
    n = len(graph.node_tpl)
    ranked = sorted(range(len(priorities)), key=lambda t: (-priorities[t], t))
    prio_rank = [0] * len(priorities)
    for pos, t in enumerate(ranked):
        prio_rank[t] = pos
    shift = max(1, n).bit_length()
    mask = (1 << shift) - 1
    tpl = graph.node_tpl
    keys = [(prio_rank[tpl[i]] << shift) | i for i in range(n)]
    indeg = list(graph.indeg)
    succ = graph.succ
    heap = [keys[i] for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    push, pop, append = heapq.heappush, heapq.heappop, order.append
    while heap:
        node = pop(heap) & mask
        append(node)
        for nxt in succ[node]:
            indeg[nxt] -= 1
            if not indeg[nxt]:
                push(heap, keys[nxt])
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise GraphError(f"the unrolled graph has a cycle through {graph.name(stuck)}")
    return order

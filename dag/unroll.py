"""Unroll the per-iteration template over iterations (and ranks), then schedule it.

The plan stores one iteration; the runtime executes it again and again. For
display (``hetrun plan --unroll N``) and for scale checks we materialize the
graph over a window of iterations, either one node per dispatch (component
level) or one node per dispatch *per rank* (what really runs on a 4096-GPU
job). Cross-iteration deps (``lag``) become real edges inside the window;
deps that point before the window are taken as done.

Lags are the ones the runtime enforces (``dag.routing.enforced_lag``: the
pipeline window caps a tolerance window, the coarse mode is lag 1).

Rank mapping of an edge: on the same component rank r waits for rank r (a
collective's cross-rank wait happens inside the collective); across
components consumer rank d waits for the producer ranks p with p % C == d
(or for p = d % P when producers are fewer), the runtime's own routing
(``dag.routing.feeding_ranks``), so edges stay O(max(P, C)), not O(P*C).

Representation: nodes come in *blocks* (one template action of one iteration,
one node per rank, contiguous ids) and edges are stored per block pair with
their rank mapping, not per node pair. Successors are computed on the fly, so
building a 150,000-action window costs a few list extends, and the scheduler
touches each edge exactly once. This is the hot path of benchmarks/plan_scale.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetrun.dag.plan import Plan
from hetrun.dag.routing import enforced_lag, fed_ranks

from hetrun import rundir
from hetrun.errors import GraphError

_IDENTITY = 0  # rank r -> rank r (same width)
_SPREAD = 1  # block mapping between components of different sizes


def _consumer_lists(producers: int, consumers: int) -> list[list[int]]:
    """For each producer rank, the consumer ranks it feeds (the runtime's routing)."""
    return [fed_ranks(producers, consumers, p) for p in range(producers)]


@dataclass
class UnrolledGraph:
    template_ids: list[str]
    block_tpl: list[int]  # block -> template action index
    block_iter: list[int]
    block_base: list[int]  # first node id of the block
    block_width: list[int]
    per_rank: bool
    node_block: list[int]  # node -> block
    out: list[list[tuple[int, int]]]  # block -> [(consumer block, mapping)]
    indeg: list[int]  # per node
    n_edges: int
    _spread: dict[tuple[int, int], list[list[int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.node_block)

    def rank(self, node: int) -> int:
        return node - self.block_base[self.node_block[node]] if self.per_rank else -1

    def name(self, node: int) -> str:
        b = self.node_block[node]
        base = f"i{self.block_iter[b]}/{self.template_ids[self.block_tpl[b]]}"
        return f"{base}@r{node - self.block_base[b]}" if self.per_rank else base

    def spread(self, producers: int, consumers: int) -> list[list[int]]:
        key = (producers, consumers)
        if key not in self._spread:
            self._spread[key] = _consumer_lists(producers, consumers)
        return self._spread[key]

    def successors(self, node: int) -> list[int]:
        b = self.node_block[node]
        r = node - self.block_base[b]
        result = []
        for c, mode in self.out[b]:
            if mode == _IDENTITY:
                result.append(self.block_base[c] + r)
            else:
                cb = self.block_base[c]
                result.extend(cb + x for x in self.spread(self.block_width[b], self.block_width[c])[r])
        return result

    def predecessors(self) -> list[list[int]]:
        """Every node's predecessors (for display; O(E))."""
        preds: list[list[int]] = [[] for _ in range(len(self))]
        for node in range(len(self)):
            for nxt in self.successors(node):
                preds[nxt].append(node)
        return preds


def unroll(plan: Plan, iterations: int, *, per_rank: bool = False, start: int = 0) -> UnrolledGraph:
    """Iterations ``start .. start+iterations-1`` of ``plan`` as one explicit graph."""
    if iterations < 1:
        raise GraphError(f"cannot unroll {iterations} iterations; expected at least 1")
    actions = plan.actions
    index = {a.id: i for i, a in enumerate(actions)}
    sizes = {c.name: (c.ntasks if per_rank else 1) for c in plan.components}
    width = [sizes[a.component] for a in actions]
    training = plan.training  # None for a job of command components only (no actions)
    mode, window = (training.mode, training.pipeline_window) if training else ("pipelined", 0)
    dep_lists = [[(index[d.id], enforced_lag(d.lag, actions[index[d.id]].component == a.component,
                                             mode, window))
                  for d in a.deps] for a in actions]
    every = [a.every for a in actions]

    block_tpl: list[int] = []
    block_iter: list[int] = []
    block_base: list[int] = []
    block_width: list[int] = []
    node_block: list[int] = []
    block_of: dict[tuple[int, int], int] = {}  # (iteration, template index) -> block
    for it in range(start, start + iterations):
        for t in range(len(actions)):
            if not rundir.runs_at(every[t], it):
                continue
            b = len(block_tpl)
            block_of[(it, t)] = b
            block_tpl.append(t)
            block_iter.append(it)
            block_base.append(len(node_block))
            block_width.append(width[t])
            node_block.extend([b] * width[t])

    graph = UnrolledGraph([a.id for a in actions], block_tpl, block_iter, block_base, block_width,
                          per_rank, node_block, [[] for _ in block_tpl], [], 0)
    indeg = [0] * len(node_block)
    n_edges = 0
    for (it, t), b in block_of.items():
        w, base = width[t], block_base[b]
        identity_in = 0
        for d, lag in dep_lists[t]:
            src = block_of.get((it - lag, d))
            if src is None:
                continue  # before the window, or an iteration where d does not run
            if width[d] == w:
                graph.out[src].append((b, _IDENTITY))
                identity_in += 1
                n_edges += w
            else:
                graph.out[src].append((b, _SPREAD))
                for r_list in graph.spread(width[d], w):
                    for r in r_list:
                        indeg[base + r] += 1
                        n_edges += 1
        if identity_in:
            indeg[base:base + w] = [x + identity_in for x in indeg[base:base + w]]
    graph.indeg = indeg
    graph.n_edges = n_edges
    return graph


def schedule_order(graph: UnrolledGraph, priorities: Sequence[float]) -> list[int]:
    """Topological order, highest template priority first, then earlier iteration/rank.

    Heap-based Kahn over int keys ``priority rank << bits | node``: O(E log V).
    ``priorities`` is per template action.
    """
    n = len(graph)
    ranked = sorted(range(len(priorities)), key=lambda t: (-priorities[t], t))
    prio_rank = [0] * len(priorities)
    for pos, t in enumerate(ranked):
        prio_rank[t] = pos
    shift = max(1, n).bit_length()
    mask = (1 << shift) - 1
    base, width, node_block = graph.block_base, graph.block_width, graph.node_block
    block_key = [prio_rank[t] << shift for t in graph.block_tpl]
    # Per block: identity edges as (first node of the consumer block, its key base),
    # so the hot loop is two additions; a node's key is key base + node id.
    ident: list[list[tuple[int, int]]] = []
    spread: list[list[tuple[int, int, list[list[int]]]]] = []
    for b, outs in enumerate(graph.out):
        ident.append([(base[c], block_key[c] + base[c]) for c, mode in outs if mode == _IDENTITY])
        spread.append([(base[c], block_key[c] + base[c], graph.spread(width[b], width[c]))
                       for c, mode in outs if mode != _IDENTITY])
    indeg = list(graph.indeg)
    heap = [block_key[node_block[i]] | i for i in range(n) if not indeg[i]]
    heapq.heapify(heap)
    order: list[int] = []
    push, pop, append = heapq.heappush, heapq.heappop, order.append
    while heap:
        node = pop(heap) & mask
        append(node)
        b = node_block[node]
        r = node - base[b]
        for cbase, ckey in ident[b]:
            t = cbase + r
            d = indeg[t] - 1
            indeg[t] = d
            if not d:
                push(heap, ckey + r)
        if spread[b]:
            for cbase, ckey, lists in spread[b]:
                for x in lists[r]:
                    t = cbase + x
                    d = indeg[t] - 1
                    indeg[t] = d
                    if not d:
                        push(heap, ckey + x)
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise GraphError(f"the unrolled graph has a cycle through {graph.name(stuck)}")
    return order

"""Training actions and the per-iteration action graph.

A ``TrainingAction`` is one dispatch of one action type on one component (every
rank of the component runs it on its share). Deps carry a ``lag``: ``lag=k``
means "that action of iteration i-k", which is how cross-iteration edges
(weights of the previous step, a rollout's tolerance window) are expressed
without unrolling. A dep on an iteration that does not exist (i-k < 0) or on
which the target does not run (``every``) counts as satisfied.

Action ids are ``<type>[.<tag>][.m<micro>]`` (``forward.m0``, ``sync.grads``);
a fused dispatch joins its members with ``+``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hetrun.errors import GraphError

ACTION_TYPES = ("rollout", "forward", "backward", "sync", "optimize", "checkpoint", "eval")


@dataclass(slots=True)
class ResourceProfile:
    """What one rank needs while running the action (memory = held for its lifetime)."""

    cpu: int = 1
    gpu: int = 0
    memory_mb: int = 0
    gpu_memory_mb: int = 0

    def merged(self, other: ResourceProfile) -> ResourceProfile:
        """Peak needs of two actions run one after the other in one dispatch."""
        return ResourceProfile(max(self.cpu, other.cpu), max(self.gpu, other.gpu),
                               max(self.memory_mb, other.memory_mb),
                               max(self.gpu_memory_mb, other.gpu_memory_mb))


@dataclass(frozen=True, slots=True)
class Dep:
    """``id`` of iteration i - ``lag``. ``kind``: data, memory (1F1B ordering), user (spec ``after``)."""

    id: str
    lag: int = 0
    kind: str = "data"


@dataclass(slots=True)
class TrainingAction:
    id: str
    action_type: str
    component: str
    resource_profile: ResourceProfile
    deps: list[Dep] = field(default_factory=list)
    tolerance_window: int = 0
    qos: str = "normal"
    micro: int | None = None
    every: int = 1  # runs on iterations i with (i + 1) % every == 0
    fused: list[str] = field(default_factory=list)
    priority: float = 0.0


def split_id(action_id: str) -> tuple[str, str | None, int | None]:
    """``forward.m3`` -> ('forward', None, 3); ``sync.grads`` -> ('sync', 'grads', None)."""
    parts = action_id.split(".")
    micro = None
    if len(parts) > 1 and parts[-1].startswith("m") and parts[-1][1:].isdigit():
        micro = int(parts[-1][1:])
        parts = parts[:-1]
    tag = ".".join(parts[1:]) or None
    return parts[0], tag, micro


class ActionGraph:
    """Actions of one iteration, in insertion order, with lag-annotated deps."""

    def __init__(self, actions: Iterable[TrainingAction] = ()) -> None:
        self._actions: dict[str, TrainingAction] = {}
        for a in actions:
            self.add(a)

    def add(self, action: TrainingAction) -> TrainingAction:
        if action.id in self._actions:
            raise GraphError(f"action id {action.id!r} is defined twice")
        self._actions[action.id] = action
        return action

    def __getitem__(self, action_id: str) -> TrainingAction:
        return self._actions[action_id]

    def __contains__(self, action_id: object) -> bool:
        return action_id in self._actions

    def __iter__(self) -> Iterator[TrainingAction]:
        return iter(self._actions.values())

    def __len__(self) -> int:
        return len(self._actions)

    def ids(self) -> list[str]:
        return list(self._actions)

    def copy(self) -> ActionGraph:
        return ActionGraph(
            TrainingAction(a.id, a.action_type, a.component,
                           ResourceProfile(a.resource_profile.cpu, a.resource_profile.gpu,
                                           a.resource_profile.memory_mb, a.resource_profile.gpu_memory_mb),
                           list(a.deps), a.tolerance_window, a.qos, a.micro, a.every, list(a.fused),
                           a.priority)
            for a in self)

    def consumers(self) -> dict[str, list[tuple[str, Dep]]]:
        """For each action, the actions that depend on it (any lag)."""
        out: dict[str, list[tuple[str, Dep]]] = {a.id: [] for a in self}
        for a in self:
            for d in a.deps:
                if d.id in out:
                    out[d.id].append((a.id, d))
        return out

    def validate(self) -> None:
        """Unknown deps, negative lags and lag-0 cycles are ``GraphError``s."""
        for a in self:
            for d in a.deps:
                if d.id not in self._actions:
                    raise GraphError(f"action {a.id!r} depends on unknown action {d.id!r}",
                                     hint="deps name action ids of the same template")
                if d.lag < 0:
                    raise GraphError(f"action {a.id!r} depends on {d.id!r} with negative lag {d.lag}")
        cycle = self.find_cycle()
        if cycle:
            raise GraphError("dependency cycle: " + " -> ".join(cycle),
                             hint="remove one of these deps (check actions.<type>.after in the job YAML)")

    def find_cycle(self) -> list[str] | None:
        """A lag-0 cycle spelled out as ``[a, b, c, a]`` (a depends on b ...), or None."""
        white, grey, black = 0, 1, 2
        color = dict.fromkeys(self._actions, white)
        for root in self._actions:
            if color[root] != white:
                continue
            stack: list[tuple[str, Iterator[Dep]]] = [(root, iter(self._actions[root].deps))]
            path = [root]
            color[root] = grey
            while stack:
                node, deps = stack[-1]
                advanced = False
                for d in deps:
                    if d.lag != 0:
                        continue
                    if color[d.id] == grey:
                        start = path.index(d.id)
                        return [*path[start:], d.id]
                    if color[d.id] == white:
                        color[d.id] = grey
                        path.append(d.id)
                        stack.append((d.id, iter(self._actions[d.id].deps)))
                        advanced = True
                        break
                if not advanced:
                    color[node] = black
                    path.pop()
                    stack.pop()
        return None

    def topological_order(self) -> list[str]:
        """Lag-0 topological order; ready actions by highest priority, then insertion order.

        Heap-based Kahn: O(E log V).
        """
        index = {aid: i for i, aid in enumerate(self._actions)}
        indeg = dict.fromkeys(self._actions, 0)
        succ: dict[str, list[str]] = {aid: [] for aid in self._actions}
        for a in self:
            for d in {d.id for d in a.deps if d.lag == 0}:
                indeg[a.id] += 1
                succ[d].append(a.id)
        heap = [(-self._actions[aid].priority, index[aid], aid) for aid, n in indeg.items() if n == 0]
        heapq.heapify(heap)
        order: list[str] = []
        while heap:
            _, _, aid = heapq.heappop(heap)
            order.append(aid)
            for nxt in succ[aid]:
                indeg[nxt] -= 1
                if indeg[nxt] == 0:
                    heapq.heappush(heap, (-self._actions[nxt].priority, index[nxt], nxt))
        if len(order) != len(self._actions):
            cycle = self.find_cycle() or []
            raise GraphError("dependency cycle: " + " -> ".join(cycle))
        return order


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """One node's schedulable resources (from ``sinfo``, or derived from the spec)."""

    name: str
    cpus: int
    gpus: int
    mem_mb: int

"""Fitness-matched placement of one het component against a pool snapshot.

Not wired into job specs yet (``placement: auto`` / ``submit --fit`` need dag/
changes): this module scores the candidates so that wiring is a thin step.
A candidate is a (partition, GRES type) group of nodes; each one gets a score
and the reasons behind it, so ``plan --explain`` can show why one lost:

- it must be able to hold the component at all (enough nodes of that shape,
  whatever their load) or it is out;
- it fits now (enough nodes with the CPUs, GPUs and memory free) or must wait;
- free GPU share of the group (an idle GPU type beats a busy one), minus
  queue pressure (jobs already pending on the partition), minus nodes with a
  failure history among those it would use, minus CPU-only work on GPU nodes.

Pure arithmetic on ``PoolSnapshot``; no Slurm call (Slurm's own start-time
estimate, ``sbatch --test-only``, is the next step and not done here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrun.slurm_plugin.pool import NodeFree, PoolSnapshot

FITS_NOW_BONUS = 100.0
PENDING_PENALTY = 5.0  # per pending job on the partition
TROUBLE_PENALTY = 20.0  # per troubled node the component would land on
GPU_WASTE_PENALTY = 10.0  # CPU-only work on GPU nodes keeps GPUs from GPU work


@dataclass(frozen=True)
class Need:
    """Per-node needs of one component (hetrun's plan.json component, or any job shape)."""

    nodes: int
    cpus_per_node: int
    gpus_per_node: int = 0
    mem_mb_per_node: int = 0
    gpu_types: tuple[str, ...] = ()  # allowed GRES types ("a100"); empty = any
    partitions: tuple[str, ...] = ()  # allowed partitions; empty = any

    @classmethod
    def from_component(cls, comp: dict, **limits: tuple[str, ...]) -> Need:
        return cls(nodes=int(comp["nodes"]), cpus_per_node=int(comp["tasks_per_node"]) * int(comp["cpus_per_task"]),
                   gpus_per_node=int(comp.get("gpus_per_node", 0)), mem_mb_per_node=int(comp.get("mem_mb", 0)),
                   **limits)


@dataclass
class Candidate:
    partition: str
    gres: str
    score: float
    fits_now: bool
    nodes: list[str] = field(default_factory=list)  # the nodes it would use now
    reasons: list[str] = field(default_factory=list)


def _fits_now(n: NodeFree, need: Need) -> bool:
    return (n.cpus_free >= need.cpus_per_node and n.gpus_free >= need.gpus_per_node
            and n.mem_free_mb >= need.mem_mb_per_node)


def _allowed(gres: str, need: Need) -> bool:
    if need.gpus_per_node and gres == "-":
        return False
    if not need.gpu_types:
        return True
    return gres.partition(":")[2] in {t.lower() for t in need.gpu_types}


def score(need: Need, snap: PoolSnapshot) -> list[Candidate]:
    """Every candidate group, best first; ones that can never hold the component are left out."""
    pending = {p.partition: p.jobs for p in snap.pending}
    troubled = {t.node for t in snap.troubled}
    out = []
    for row in snap.rows:
        if need.partitions and row.partition not in need.partitions:
            continue
        if not _allowed(row.gres, need):
            continue
        members = [n for n in snap.nodes if row.partition in n.partitions and n.gres == row.gres]
        # Can the group ever hold it? (its nodes' average size; groups are uniform in practice)
        gpus_each, cpus_each = (row.gpus_total // max(1, row.node_total), row.cpus_total // max(1, row.node_total))
        if row.node_total < need.nodes or gpus_each < need.gpus_per_node or cpus_each < need.cpus_per_node:
            continue
        free = sorted((n for n in members if _fits_now(n, need)), key=lambda n: (n.name in troubled, n.name))
        fits = len(free) >= need.nodes
        chosen = [n.name for n in free[:need.nodes]] if fits else []
        gpu_free = (row.gpus_total - row.gpus_alloc) / row.gpus_total if row.gpus_total else 0.0
        cpu_free = (row.cpus_total - row.cpus_alloc) / row.cpus_total if row.cpus_total else 0.0
        bad = sum(1 for n in chosen if n in troubled)
        value = (FITS_NOW_BONUS if fits else 0.0) + 50.0 * (gpu_free if need.gpus_per_node else cpu_free) \
            - PENDING_PENALTY * pending.get(row.partition, 0) - TROUBLE_PENALTY * bad
        gpu_waste = not need.gpus_per_node and row.gres != "-"
        if gpu_waste:
            value -= GPU_WASTE_PENALTY
        reasons = [f"{len(free)} nodes free now, {need.nodes} needed" + ("" if fits else " (would wait)"),
                   f"{100 * gpu_free:.0f}% GPUs free, {100 * cpu_free:.0f}% CPUs free",
                   f"{pending.get(row.partition, 0)} jobs pending on {row.partition}"]
        if gpu_waste:
            reasons.append("CPU-only work on GPU nodes")
        if bad:
            reasons.append(f"{bad} of its nodes have a failure history")
        out.append(Candidate(row.partition, row.gres, round(value, 2), fits, chosen, reasons))
    return sorted(out, key=lambda c: (-c.score, c.partition, c.gres))

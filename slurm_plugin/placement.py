"""Fitness-matched placement of one het component against a pool snapshot.

``placement: auto`` / ``hetrun submit --fit`` (``placement_fit``) derive each
component's ``Need`` (``hetrun.dag.needs``) and pick with this module's scores.
A candidate is a (partition, GRES type) group of nodes; each one gets a score
and the reasons behind it, so ``plan --explain`` can show why one lost:

- it must be able to hold the component at all (enough nodes of that shape,
  whatever their load, and a GPU type not known to have less memory than the
  component's GPU memory need) or it is out;
- it fits now (enough nodes with the CPUs, GPUs and memory free) or must wait;
- free GPU share of the group (an idle GPU type beats a busy one), minus
  queue pressure (jobs already pending on the partition), minus nodes with a
  failure history among those it would use, minus CPU-only work on GPU nodes.

``score`` is pure arithmetic on ``PoolSnapshot``; ``with_start_estimates``
then asks Slurm itself (``sbatch --test-only``, one call per candidate) when
each candidate would start, and lowers a candidate's score by the minutes it
would wait: the one expected to start (and so finish) first wins.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from hetrun.dag.errors import SlurmError
from hetrun.slurm_plugin.backends.slurm_cli import run_slurm
from hetrun.slurm_plugin.pool import NodeFree, PoolSnapshot

if TYPE_CHECKING:
    from hetrun.dag.needs import ComponentNeed

FITS_NOW_BONUS = 100.0
PENDING_PENALTY = 5.0  # per pending job on the partition
TROUBLE_PENALTY = 20.0  # per troubled node the component would land on
GPU_WASTE_PENALTY = 10.0  # CPU-only work on GPU nodes keeps GPUs from GPU work
WAIT_PENALTY_PER_MIN = 2.0  # per minute Slurm expects the candidate to wait
WAIT_PENALTY_MAX = 200.0  # a start Slurm cannot place at all loses to any that starts
# Memory of one GPU of the common GRES types (the smallest model sold under the
# name): a type known to be smaller than a component's GPU memory need is out.
# A type not listed here is not checked (its reason says so).
GPU_MEMORY_MB = {"k80": 12 * 1024, "p100": 12 * 1024, "v100": 16 * 1024, "t4": 16 * 1024, "a10": 24 * 1024,
                 "l4": 24 * 1024, "a30": 24 * 1024, "a40": 48 * 1024, "l40s": 48 * 1024, "a100": 40 * 1024,
                 "h100": 80 * 1024, "h200": 141 * 1024, "b200": 180 * 1024}
# sbatch --test-only (stderr): "sbatch: Job 12 to start at 2026-12-01T18:50:40 using 2 processors on nodes n1 in partition debug"
_TEST_ONLY = re.compile(r"to start at (\S+) using \d+ processors on nodes (\S+) in partition (\S+)")


@dataclass(frozen=True)
class Need:
    """Per-node needs of one component (hetrun's plan.json component, or any job shape)."""

    nodes: int
    cpus_per_node: int
    gpus_per_node: int = 0
    mem_mb_per_node: int = 0
    gpu_types: tuple[str, ...] = ()  # allowed GRES types ("a100"); empty = any
    partitions: tuple[str, ...] = ()  # allowed partitions; empty = any
    gpu_mem_mb: int = 0  # memory one GPU must have; 0 = not known

    @classmethod
    def from_component(cls, comp: dict, gpu_types: tuple[str, ...] = (), partitions: tuple[str, ...] = ()) -> Need:
        """From a plan.json component (its request only; ``from_needs`` adds what its actions need)."""
        return cls(nodes=int(comp["nodes"]), cpus_per_node=int(comp["tasks_per_node"]) * int(comp["cpus_per_task"]),
                   gpus_per_node=int(comp.get("gpus_per_node", 0)), mem_mb_per_node=int(comp.get("mem_mb", 0)),
                   gpu_types=gpu_types, partitions=partitions)

    @classmethod
    def from_needs(cls, need: ComponentNeed) -> Need:
        """From the needs ``hetrun.dag.needs`` derived from the component's action profiles."""
        return cls(need.nodes, need.cpus_per_node, need.gpus_per_node, need.mem_mb_per_node,
                   need.gpu_types, need.partitions, need.gpu_mem_mb_per_gpu)


@dataclass
class Candidate:
    partition: str
    gres: str
    score: float
    fits_now: bool
    nodes: list[str] = field(default_factory=list)  # the nodes it would use now
    reasons: list[str] = field(default_factory=list)
    start_in_s: float | None = None  # Slurm's own estimate (sbatch --test-only), when asked


def _fits_now(n: NodeFree, need: Need) -> bool:
    return (n.cpus_free >= need.cpus_per_node and n.gpus_free >= need.gpus_per_node
            and n.mem_free_mb >= need.mem_mb_per_node)


def _allowed(gres: str, need: Need) -> bool:
    if need.gpus_per_node and gres == "-":
        return False
    known_mb = GPU_MEMORY_MB.get(gres.partition(":")[2])
    if need.gpus_per_node and need.gpu_mem_mb and known_mb is not None and known_mb < need.gpu_mem_mb:
        return False
    if not need.gpu_types:
        return True
    return gres.partition(":")[2] in {t.lower() for t in need.gpu_types}


def excluded(need: Need, snap: PoolSnapshot) -> list[str]:
    """Why each (partition, GRES) group of the pool that ``score`` leaves out cannot hold ``need``."""
    out = []
    for row in snap.rows:
        gtype = row.gres.partition(":")[2]
        gpus_each, cpus_each = row.gpus_total // max(1, row.node_total), row.cpus_total // max(1, row.node_total)
        why = None
        if need.partitions and row.partition not in need.partitions:
            why = "partition not allowed (partitions: / slurm.partition)"
        elif need.gpus_per_node and row.gres == "-":
            why = "no GPUs"
        elif need.gpus_per_node and need.gpu_mem_mb and GPU_MEMORY_MB.get(gtype, need.gpu_mem_mb) < need.gpu_mem_mb:
            why = f"{gtype} has {GPU_MEMORY_MB[gtype]} MB per GPU, {need.gpu_mem_mb} MB needed"
        elif not _allowed(row.gres, need):
            why = "GPU type not allowed (gpu_types:)"
        elif row.node_total < need.nodes:
            why = f"{row.node_total} nodes, {need.nodes} needed"
        elif gpus_each < need.gpus_per_node or cpus_each < need.cpus_per_node:
            why = f"nodes have {cpus_each} CPUs / {gpus_each} GPUs, {need.cpus_per_node} / {need.gpus_per_node} needed"
        if why:
            out.append(f"{row.partition} {row.gres}: {why}")
    return out


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


def test_only_argv(need: Need, cand: Candidate) -> list[str]:
    """The ``sbatch --test-only`` words for ``need`` placed on ``cand`` (nothing is submitted)."""
    argv = ["sbatch", "--test-only", f"--partition={cand.partition}", f"--nodes={need.nodes}",
            "--ntasks-per-node=1", f"--cpus-per-task={need.cpus_per_node}"]
    if need.gpus_per_node:
        argv.append(f"--gres={cand.gres}:{need.gpus_per_node}")  # gpu:a100:2 or gpu:2
    if need.mem_mb_per_node:
        argv.append(f"--mem={need.mem_mb_per_node}M")
    return [*argv, "--wrap", "true"]


def parse_test_only(stderr: str, now: float) -> float | None:
    """Seconds from ``now`` until the start ``sbatch --test-only`` printed; None when it printed none."""
    m = _TEST_ONLY.search(stderr)
    if not m:
        return None
    start = datetime.fromisoformat(m.group(1)).timestamp()  # local time, as Slurm prints it
    return max(0.0, start - now)


def with_start_estimates(need: Need, cands: Sequence[Candidate],
                         test_only: Callable[[list[str]], str], now: float | None = None) -> list[Candidate]:
    """``cands`` re-scored with Slurm's start-time estimate; ``test_only(argv)`` runs
    sbatch and returns its stderr (a refusal's message too). Best first again."""
    now = time.time() if now is None else now
    for c in cands:
        text = test_only(test_only_argv(need, c))
        c.start_in_s = parse_test_only(text, now)
        if c.start_in_s is None:
            c.score = round(c.score - WAIT_PENALTY_MAX, 2)
            c.reasons.append("Slurm gives no start time: " + (text.strip().splitlines() or ["(no output)"])[-1])
            continue
        c.score = round(c.score - min(WAIT_PENALTY_MAX, WAIT_PENALTY_PER_MIN * c.start_in_s / 60), 2)
        c.reasons.append(f"Slurm expects a start in {c.start_in_s:.0f} s")
    return sorted(cands, key=lambda c: (-c.score, c.partition, c.gres))


def slurm_test_only(env: dict[str, str] | None = None) -> Callable[[list[str]], str]:
    """A ``test_only`` for ``with_start_estimates`` that runs the real sbatch."""
    def run(argv: list[str]) -> str:
        try:
            return run_slurm(argv, env=env).stderr
        except SlurmError as exc:  # e.g. "Requested node configuration is not available"
            return str(exc)
    return run

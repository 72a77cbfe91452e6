"""Fitness-matched placement of one het component against a pool snapshot.

``placement: auto`` / ``hetrun submit --fit`` (``placement_fit``) derive each
component's ``Need`` (``hetrun.dag.needs``) and pick with this module's scores.
A candidate is a (partition, GRES type) group of nodes, and a node count where
the component gives ``node_counts:``; each one gets a score and the reasons
behind it, so ``plan --explain`` can show why one lost:

- it must be able to hold the component at all (enough nodes of that shape,
  whatever their load, and a GPU type not known to have less memory than the
  component's GPU memory need) and stay inside the submitter's quotas as Slurm
  holds them (``slurm_plugin.quota``) or it is out (``_why_out``: one rule set);
- it fits now (enough nodes with the CPUs, GPUs and memory free) or must wait;
- free GPU share of the group (an idle GPU type beats a busy one), minus
  queue pressure (jobs already pending on the partition), minus nodes with a
  failure history among those it would use, minus CPU-only work on GPU nodes,
  minus a quota's brim (a limit past half full after it), minus each node
  beyond the fewest allowed (more so when its traffic crosses nodes);
- where it must wait and may preempt (``Need.preempts``), minus the work a start by
  preemption would throw away (``preemption_plan``: idle nodes and jobs that stop clean at
  an agreed step cost nothing, a plain job all it has run), so the group that loses least
  ranks first; its victims' nodes (``Candidate.preempt_nodes``) are what ``placement:
  ranked`` names (``--nodelist``): Slurm's own choice within a partition is the smallest jobs
  of the lowest QOS, whatever they have run (preempt/qos ``_gen_job_prio``).

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

from hetrun.slurm_plugin import quota
from hetrun.slurm_plugin.backends.slurm_cli import run_slurm
from hetrun.slurm_plugin.pool import NodeFree, PoolRow, PoolSnapshot, RunningUse
from hetrun.slurm_plugin.quota import Quotas

from hetrun.errors import SlurmError

if TYPE_CHECKING:
    from hetrun.dag.needs import ComponentNeed

FITS_NOW_BONUS = 100.0
PENDING_PENALTY = 5.0  # per pending job on the partition
TROUBLE_PENALTY = 20.0  # per troubled node the component would land on
GPU_WASTE_PENALTY = 10.0  # CPU-only work on GPU nodes keeps GPUs from GPU work
QUOTA_NEAR_PENALTY = 30.0  # at a quota's brim (from quota.NEAR_FROM of it, growing to this at 100%)
SPREAD_PENALTY = 3.0  # per node beyond the fewest allowed: nodes other whole-node jobs cannot have
CROSS_NODE_PENALTY = 4.0  # per extra node, times the component's cross-node traffic weight
PREEMPT_LOSS_PER_NODE_MIN = 5.0  # per node-minute of work a start by preemption would throw away
PREEMPT_LOSS_MAX = 150.0  # the most a loss costs: a start at once still beats a long wait
PREEMPT_BLOCKED_PENALTY = 200.0  # a group preemption cannot free: the job waits for jobs to end there
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
    fewest_nodes: int = 0  # node count is a candidate dimension: the fewest allowed (0: it is not)
    cross_node: float = 0.0  # weight of its traffic across nodes (hetrun.dag.needs)
    # QOS names whose running jobs this job's QOS may preempt (Slurm's Preempt= list), and those
    # of them whose jobs checkpoint and stop at an agreed step (a policy's ``<tier>_ckpt``):
    # where it must preempt, the group whose preemption loses least work ranks first.
    preempts: tuple[str, ...] = ()
    stops_clean: tuple[str, ...] = ()
    # A plain victim (one not in ``stops_clean``) that has run longer than this is not taken
    # (None: any age): a start by preemption that may cost a young job little and no old one.
    young_s: float | None = None

    @classmethod
    def from_component(cls, comp: dict, gpu_types: tuple[str, ...] = (), partitions: tuple[str, ...] = ()) -> Need:
        """From a plan.json component (its request only; ``from_needs`` adds what its actions need)."""
        return cls(nodes=int(comp["nodes"]), cpus_per_node=int(comp["tasks_per_node"]) * int(comp["cpus_per_task"]),
                   gpus_per_node=int(comp.get("gpus_per_node", 0)), mem_mb_per_node=int(comp.get("mem_mb", 0)),
                   gpu_types=gpu_types, partitions=partitions)

    @classmethod
    def from_needs(cls, need: ComponentNeed, fewest_nodes: int = 0) -> Need:
        """From the needs ``hetrun.dag.needs`` derived from the component's action profiles
        (``fewest_nodes``: the smallest of its ``node_counts``, when it has them)."""
        return cls(need.nodes, need.cpus_per_node, need.gpus_per_node, need.mem_mb_per_node,
                   need.gpu_types, need.partitions, need.gpu_mem_mb_per_gpu, fewest_nodes, need.cross_node)

    @classmethod
    def shapes(cls, need: ComponentNeed) -> list[Need]:
        """One ``Need`` per node count the component may take (``node_counts:``), or its own."""
        fewest = min(need.node_counts) if need.node_counts else 0
        return [cls.from_needs(n, fewest) for n in need.at_each_count()]


@dataclass
class Candidate:
    partition: str
    gres: str
    score: float
    fits_now: bool
    nodes: list[str] = field(default_factory=list)  # the nodes it would use now
    reasons: list[str] = field(default_factory=list)
    start_in_s: float | None = None  # Slurm's own estimate (sbatch --test-only), when asked
    node_count: int = 0  # the node count it stands for, when node count is a dimension (0: as written)
    # Where it must preempt: the victims' nodes to name (``--nodelist``), so that Slurm preempts
    # the jobs that lose least (it takes the rest from idle nodes); empty otherwise.
    preempt_nodes: list[str] = field(default_factory=list)
    # ... and the node-seconds that start loses (None: it fits now, may not preempt, or
    # preemption cannot free enough nodes)
    preempt_loss: float | None = None

    @property
    def label(self) -> str:
        return group_label(self.partition, self.gres, self.node_count)


def group_label(partition: str, gres: str, node_count: int = 0) -> str:
    """A candidate's name in reasons and ``--explain`` ("debug gpu:a100 x2 nodes")."""
    return f"{partition} {gres}" + (f" x{node_count} nodes" if node_count else "")


def _fits_now(n: NodeFree, need: Need) -> bool:
    return (n.cpus_free >= need.cpus_per_node and n.gpus_free >= need.gpus_per_node
            and n.mem_free_mb >= need.mem_mb_per_node)


def _why_out(row: PoolRow, need: Need, quotas: Quotas | None) -> str | None:
    """Why the (partition, GRES) group ``row`` can never hold ``need`` (None: it is a candidate).
    The one rule set of ``score`` and ``excluded``."""
    gtype = row.gres.partition(":")[2]
    known_mb = GPU_MEMORY_MB.get(gtype.lower())  # a job names types ignoring case; Slurm's spelling is kept
    gpus_each, cpus_each = row.gpus_total // max(1, row.node_total), row.cpus_total // max(1, row.node_total)
    if need.partitions and row.partition not in need.partitions:
        return "partition not allowed (partitions: / slurm.partition)"
    if need.gpus_per_node and row.gres == "-":
        return "no GPUs"
    if need.gpus_per_node and need.gpu_mem_mb and known_mb is not None and known_mb < need.gpu_mem_mb:
        return f"{gtype} has {known_mb} MB per GPU, {need.gpu_mem_mb} MB needed"
    if need.gpu_types and gtype.lower() not in {t.lower() for t in need.gpu_types}:
        return "GPU type not allowed (gpu_types:)"
    if row.node_total < need.nodes:
        return f"{row.node_total} nodes, {need.nodes} needed"
    # The group's nodes are judged by their average size (groups are uniform in practice).
    if gpus_each < need.gpus_per_node or cpus_each < need.cpus_per_node:
        return f"nodes have {cpus_each} CPUs / {gpus_each} GPUs, {need.cpus_per_node} / {need.gpus_per_node} needed"
    return quota.check(quotas, need_tres(need, row.gres))[0]


def need_tres(need: Need, gres: str) -> dict[str, int]:
    """The TRES Slurm would count against quotas for ``need`` on GRES group ``gres``."""
    return quota.job_tres(need.nodes, need.cpus_per_node, need.gpus_per_node, need.mem_mb_per_node, gres)


def excluded(need: Need, snap: PoolSnapshot, quotas: Quotas | None = None) -> list[str]:
    """Why each (partition, GRES) group of the pool that ``score`` leaves out cannot hold ``need``."""
    count = need.nodes if need.fewest_nodes else 0
    return [f"{group_label(row.partition, row.gres, count)}: {why}" for row in snap.rows
            if (why := _why_out(row, need, quotas))]


def _shape_penalty(need: Need) -> tuple[float, list[str]]:
    """Points a node count spread wider than the fewest allowed loses: nodes kept from
    whole-node jobs, and the component's traffic crossing more node boundaries."""
    extra = need.nodes - need.fewest_nodes if need.fewest_nodes else 0
    if extra <= 0:
        return 0.0, []
    cost = extra * (SPREAD_PENALTY + CROSS_NODE_PENALTY * need.cross_node)
    return cost, [f"{need.nodes} nodes, {extra} more than the fewest allowed"
                  + (" (its traffic crosses more nodes)" if need.cross_node else "")]


def score(need: Need, snap: PoolSnapshot, quotas: Quotas | None = None) -> list[Candidate]:
    """Every candidate group, best first; ones that can never hold the component (or would
    exceed a quota) are left out (``excluded`` says why)."""
    pending = {p.partition: p.jobs for p in snap.pending}
    troubled = {t.node for t in snap.troubled}
    out = []
    for row in snap.rows:
        if _why_out(row, need, quotas):
            continue
        members = [n for n in snap.nodes if row.partition in n.partitions and n.gres == row.gres]
        free = sorted((n for n in members if _fits_now(n, need)), key=lambda n: (n.name in troubled, n.name))
        fits = len(free) >= need.nodes
        chosen = [n.name for n in free[:need.nodes]] if fits else []
        gpu_free = (row.gpus_total - row.gpus_alloc) / row.gpus_total if row.gpus_total else 0.0
        cpu_free = (row.cpus_total - row.cpus_alloc) / row.cpus_total if row.cpus_total else 0.0
        bad = sum(1 for n in chosen if n in troubled)
        value = (FITS_NOW_BONUS if fits else 0.0) + 50.0 * (gpu_free if need.gpus_per_node else cpu_free) \
            - PENDING_PENALTY * pending.get(row.partition, 0) - TROUBLE_PENALTY * bad
        reasons = [f"{len(free)} nodes free now, {need.nodes} needed" + ("" if fits else " (would wait)"),
                   f"{100 * gpu_free:.0f}% GPUs free, {100 * cpu_free:.0f}% CPUs free",
                   f"{pending.get(row.partition, 0)} jobs pending on {row.partition}"]
        if not need.gpus_per_node and row.gres != "-":
            value -= GPU_WASTE_PENALTY
            reasons.append("CPU-only work on GPU nodes")
        if bad:
            reasons.append(f"{bad} of its nodes have a failure history")
        victims: list[str] = []
        loss: float | None = None
        if not fits and need.preempts:
            plan = preemption_plan(need, members, snap)
            loss = None if plan is None else plan.loss
            value -= PREEMPT_BLOCKED_PENALTY if loss is None else min(PREEMPT_LOSS_MAX,
                                                                PREEMPT_LOSS_PER_NODE_MIN * loss / 60)
            reasons.append("preemption cannot free enough nodes" if loss is None else
                           f"a start by preemption loses ~{loss:.0f} node-s of work")
            # Named only where Slurm's own choice could lose more: when every QOS the job may
            # preempt stops clean (``checkpointed.spare_plain``), any victim loses ~0, and a
            # --nodelist would only tie the job to nodes that may be taken before it starts
            # (a critical job waited 84 s for named nodes in an issue-21 replay).
            if plan is not None and not set(need.preempts) <= set(need.stops_clean):
                victims = list(plan.nodes)
        spread, why = _shape_penalty(need)
        _, fullest, quota_why = quota.check(quotas, need_tres(need, row.gres))
        near = QUOTA_NEAR_PENALTY * max(0.0, fullest - quota.NEAR_FROM) / (1 - quota.NEAR_FROM)
        value -= spread + near
        reasons += why + quota_why
        out.append(Candidate(row.partition, row.gres, round(value, 2), fits, chosen, reasons,
                             node_count=need.nodes if need.fewest_nodes else 0, preempt_nodes=victims,
                             preempt_loss=loss))
    return sorted(out, key=rank_key)


@dataclass(frozen=True)
class Preemption:
    """A start by preemption on one group: the work it loses and the victims' nodes to name."""

    loss: float  # node-seconds of work the victims lose
    nodes: tuple[str, ...]  # as many of the victims' nodes as the idle ones leave to find


def preemption_plan(need: Need, members: Sequence[NodeFree], snap: PoolSnapshot) -> Preemption | None:
    """How ``need`` starts on the group ``members`` by preempting running jobs of the QOS in
    ``need.preempts``, the jobs taken cheapest first: a job of a ``stops_clean`` QOS loses ~0 (it
    saves at the agreed stop), a plain one all it has run (its run time x its nodes), so the
    youngest goes before older ones; then any taken job the others make unneeded is given back,
    the dearest first. Idle nodes are used before any job is preempted. Nodes a pending job
    names (``snap.claimed``: another placement's victims) are neither idle nor taken. None: not
    enough nodes even so. Slurm's preempt/qos would choose otherwise (the smallest jobs of the
    lowest QOS, whatever they have run): ``nodes`` are what makes it take these."""
    claimed = set(snap.claimed)
    free = {n.name for n in members if _fits_now(n, need) and n.name not in claimed}
    if len(free) >= need.nodes:
        return Preemption(0.0, ())
    names = {n.name for n in members}
    running = snap.running_use
    on_node: dict[str, set[int]] = {}
    for i, job in enumerate(running):
        for node in job.nodes:
            if node in names:
                on_node.setdefault(node, set()).add(i)
    cost = {i: _job_loss(job, need, snap.taken_at) for i, job in enumerate(running)
            if job.qos in need.preempts and any(n in names for n in job.nodes) and not claimed & set(job.nodes)
            and not _too_old(job, need, snap.taken_at)}

    def freed(taken: set[int]) -> set[str]:
        return {n for n, jobs in on_node.items() if n not in free and n not in claimed and jobs <= taken}

    taken: set[int] = set()
    for i in sorted(cost, key=cost.__getitem__):
        taken.add(i)
        if len(free | freed(taken)) >= need.nodes:
            break
    else:
        return None
    for i in sorted(taken, key=lambda k: -cost[k]):  # a cheap job taken before a large one came
        if len(free | freed(taken - {i})) >= need.nodes:
            taken.discard(i)
    want, gone = need.nodes - len(free), freed(taken)
    nodes = [n for i in sorted(taken, key=cost.__getitem__) for n in sorted(running[i].nodes) if n in gone]
    return Preemption(sum(cost[i] for i in taken), tuple(dict.fromkeys(nodes))[:want])


def preemption_loss(need: Need, members: Sequence[NodeFree], snap: PoolSnapshot) -> float | None:
    """Node-seconds of work lost when ``need`` starts on ``members`` by preemption
    (``preemption_plan``); None: preemption cannot free enough nodes."""
    plan = preemption_plan(need, members, snap)
    return None if plan is None else plan.loss


def _too_old(job: RunningUse, need: Need, now: float) -> bool:
    """A plain job that has run past ``need.young_s`` (or since a time not known): not a victim."""
    if need.young_s is None or job.qos in need.stops_clean:
        return False
    return not job.start or now - job.start > need.young_s


def _job_loss(job: RunningUse, need: Need, now: float) -> float:
    if job.qos in need.stops_clean:
        return 0.0
    return max(0.0, now - job.start) * max(1, len(job.nodes)) if job.start else float(PREEMPT_LOSS_MAX * 60)


def rank_key(c: Candidate) -> tuple[float, str, str, int]:
    return (-c.score, c.partition, c.gres, c.node_count)


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
    return sorted(cands, key=rank_key)


def slurm_test_only(env: dict[str, str] | None = None) -> Callable[[list[str]], str]:
    """A ``test_only`` for ``with_start_estimates`` that runs the real sbatch."""
    def run(argv: list[str]) -> str:
        try:
            return run_slurm(argv, env=env).stderr
        except SlurmError as exc:  # e.g. "Requested node configuration is not available"
            return str(exc)
    return run

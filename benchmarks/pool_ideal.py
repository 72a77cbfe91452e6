"""What an ideal scheduler could reach on the replay's trace: the reference printed next
to each measured "allocated share while work is pending" (benchmarks/pool_trace_replay.py).

The ideal scheduler is a work-conserving list scheduler on the pool's three node kinds
(24 a100, 24 v100, 16 CPU-only nodes), with no scheduling latency, no job start-up or
clean-up, exact run times and no preemption. Whenever a job ends or arrives it walks the
pending jobs in (tier, arrival) order and starts every one that fits on free nodes of one
kind it may use (the kind with most free nodes): small jobs pass a blocked large one at
once, nothing is ever held idle for it. Real Slurm can only do worse in seconds lost
(launch, epilog, scheduler ticks, requeued work), so the share it reaches is the figure
a run should be judged against, beside the issue's fixed 85% target.

Not a strict upper bound on the metric: the metric averages over the seconds with work
pending, so a schedule can raise it by finishing sooner with nodes idle; the docstring of
``ideal_share`` and benchmarks/pool.md say how far a few other orders move it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

NODE_KINDS = {"a100": 24, "v100": 24, "cpu": 16}  # tests/big_cluster.py's pool


class Job(Protocol):
    at: float
    tier: str
    nodes: int
    seconds: int
    gpu_types: tuple[str, ...]
    script_partition: str


TIER_RANK = {"critical": 0, "high": 1, "normal": 2}


def kinds_by_script(job: Job) -> list[str]:
    """The default side: the partition the job's script names."""
    return [job.script_partition.removeprefix("gpu-")]


def kinds_accepted(job: Job) -> list[str]:
    """The policy side: every GPU type the job accepts; CPU jobs on CPU nodes only."""
    return list(job.gpu_types) or ["cpu"]


def ideal_share(trace: Sequence[Job], kinds: Callable[[Job], list[str]], by_tier: bool = True,
                node_kinds: dict[str, int] | None = None) -> dict[str, float]:
    """Allocated share of the pool over the seconds some job is pending, pending seconds
    and makespan of the ideal schedule (module docstring). Pending jobs are tried in
    (tier, arrival) order, as the policy's QOS priority orders them; ``by_tier=False``:
    arrival alone, the default side's FIFO."""
    free = dict(node_kinds or NODE_KINDS)
    total = sum(free.values())
    arrivals = sorted(trace, key=lambda j: j.at)
    pending: list[Job] = []
    running: list[tuple[float, str, Job]] = []
    t, nxt_arrival, busy, pending_s = 0.0, 0, 0.0, 0.0
    while nxt_arrival < len(arrivals) or pending or running:
        for job in sorted(pending, key=lambda j: (TIER_RANK[j.tier] if by_tier else 0, j.at)):
            fits = [k for k in kinds(job) if free[k] >= job.nodes]
            if fits:
                kind = max(fits, key=lambda k: free[k])
                free[kind] -= job.nodes
                running.append((t + job.seconds, kind, job))
                pending.remove(job)
        ends = [end for end, _, _ in running]
        if nxt_arrival < len(arrivals):
            ends.append(arrivals[nxt_arrival].at)
        step_to = min(ends)
        if pending:
            busy += (step_to - t) * (total - sum(free.values()))
            pending_s += step_to - t
        t = step_to
        for item in [r for r in running if r[0] <= t]:
            running.remove(item)
            free[item[1]] += item[2].nodes
        while nxt_arrival < len(arrivals) and arrivals[nxt_arrival].at <= t:
            pending.append(arrivals[nxt_arrival])
            nxt_arrival += 1
    return {"alloc_share_while_pending": round(busy / pending_s / total, 3) if pending_s else 1.0,
            "pending_seconds": round(pending_s, 1), "makespan_s": round(t - arrivals[0].at, 1) if arrivals else 0.0}

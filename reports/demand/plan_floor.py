"""The least memory per rank a component may be given without changing the run's plan.

`hetrun tune` sizes memory from the measured peak, but the plan has its own floor:
an action may declare a fixed memory (``actions.forward.memory: 256M``) that must
fit a rank, and the memory pass (dag/compile.py) keeps only as many micro-batches
in flight as fit in a rank. A proposal below that floor is a job the planner refuses
(the MoE LM: 2048M per node proposed as 576M, "one micro-batch's activations (256 MB)
plus the model state (72 MB) exceed the 288 MB"), or one with fewer micro-batches in
flight than the run the throughput was measured on. The floor is found with the
planner itself, on the run's own job.yaml, so tune and submit cannot disagree.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hetrun.dag.plan import build_plan_explained
from hetrun.dag.spec import spec_from_dict
from hetrun.dag.yaml_source import read_yaml_file

from hetrun.errors import HetrunError
from hetrun.rundir import JOB_YAML

_STEP_MB = 64  # the granularity tune proposes memory in (sizing.needed_mem_mb)


def rank_mem_mb(component: dict[str, Any]) -> int:
    """A plan.json component's memory per rank: its per-node ``mem_mb`` over its tasks per node
    (dag.spec.ComponentSpec.mem_per_task_mb's rule, for readers of plan.json)."""
    return int(component.get("mem_mb", 0)) // max(1, int(component.get("tasks_per_node", 1)))


def _inflight(job: dict[str, Any], component: str, mem_per_node_mb: int) -> int | None:
    """The memory pass's micro-batches in flight with the component at ``mem_per_node_mb``
    (0 where the pass does not concern it); None when the planner refuses the job."""
    data = copy.deepcopy(job)
    data["components"][component]["mem"] = f"{mem_per_node_mb}M"
    try:
        memory = build_plan_explained(spec_from_dict(data)).memory
    except HetrunError:
        return None
    return memory.inflight_after if memory is not None and memory.component == component else 0


def memory_floor_mb(run_dir: str | Path, component: dict[str, Any], want_mb: int) -> int:
    """Per-rank memory for ``component`` (a plan.json component) of at least ``want_mb`` with
    which the run's job plans as it ran: it builds, with the same micro-batches in flight.
    ``want_mb`` where that already holds, else the least 64 MB step up to the rank's current
    memory that does (the current memory, which the run planned with, where none does or the
    run has no job.yaml to check)."""
    path = Path(run_dir) / JOB_YAML
    current = rank_mem_mb(component)
    if want_mb >= current or not path.is_file():
        return want_mb
    try:
        job = read_yaml_file(path).data  # read once; each probe below plans a copy
    except HetrunError:
        return want_mb
    name, per_node = str(component["name"]), max(1, int(component.get("tasks_per_node", 1)))
    measured = _inflight(job, name, current * per_node)
    if measured is None:  # the run's own job does not plan here (another planner): nothing to hold to
        return want_mb

    def fits(mb: int) -> bool:
        return _inflight(job, name, mb * per_node) == measured

    if fits(want_mb):
        return want_mb
    lo, hi = 0, -(-(current - want_mb) // _STEP_MB)  # steps above want_mb: lo fails, hi = current holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(want_mb + mid * _STEP_MB):
            hi = mid
        else:
            lo = mid
    return min(current, want_mb + hi * _STEP_MB)

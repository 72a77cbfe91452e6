"""Spare nodes in a het job whose first component holds one node: a warning, not an error.

A het job's first component leads it (its first node runs the batch script). When Slurm
marks a node down (after ``SlurmdTimeout``, or an administrator's ``State=DOWN``), it
visits each component of the het job in turn (``kill_running_job_by_node_name`` in
slurmctld/job_mgr.c, Slurm 22.05; the same test in 25.11): a component of ONE node that
comes before the component holding the dead node is taken for failed too, and when it is
the leader, Slurm requeues the whole het job despite ``--no-kill``. A component of two or
more nodes only has the node removed, and the job runs on. So hetrun's restart on a spare
inside the allocation lasts only until Slurm marks the dead node down, unless the leader
holds two nodes or more (``nodes`` + ``spare_nodes``). Measured both ways on the local
cluster (tests/test_node_death_slurm.py keeps the working layout; docs/PREEMPTION.md).

Not an error: a spare on the leader costs a node, and a job that ends before
``SlurmdTimeout`` (300 s by default) never meets the case.
"""

from __future__ import annotations

from .spec import ComponentSpec, JobSpec


def _recovers(comp: ComponentSpec) -> bool:
    """A component restarted inside the allocation after a node death: a spare, or packing (min_nodes)."""
    return bool(comp.spare_nodes) or (comp.min_nodes is not None and comp.min_nodes < comp.nodes)


def spare_layout_warnings(spec: JobSpec) -> list[str]:
    """One line per problem; empty when the layout holds."""
    comps = list(spec.components.items())
    if len(comps) < 2 or not any(_recovers(c) for _, c in comps):
        return []
    name, lead = comps[0]
    if lead.nodes + lead.spare_nodes >= 2:
        return []
    spared = ", ".join(n for n, c in comps[1:] if _recovers(c))
    return [f"components.{name} leads the het job with one node: once Slurm marks a dead node of "
            f"{spared} down (SlurmdTimeout, or an administrator), it requeues the whole het job, "
            f"after hetrun restarted it on a spare (or packed); give components.{name} spare_nodes: 1 "
            "(docs/PREEMPTION.md, \"Slurm and a het job's dead node\")"]

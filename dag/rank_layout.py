"""How a component's rank count becomes nodes x tasks per node.

One rule for `hetrun tune`'s proposal (reports/demand/sizing.py) and `hetrun resubmit
--resize` (slurm_plugin/resume_run.py): the job's own tasks per node where it divides
the new rank count, else one rank per node. Memory in a job YAML is per node
(Slurm's ``--mem``), so a rank's memory becomes the node's times the tasks on it.
"""

from __future__ import annotations


def rank_layout(ranks: int, tasks_per_node: int) -> tuple[int, int]:
    """(nodes, tasks_per_node) holding ``ranks``."""
    per_node = tasks_per_node if tasks_per_node > 0 and ranks % tasks_per_node == 0 else 1
    return ranks // per_node, per_node


def layout_sets(name: str, ranks: int, tasks_per_node: int) -> list[str]:
    """``--set`` overrides giving component ``name`` ``ranks`` ranks."""
    nodes, per_node = rank_layout(ranks, tasks_per_node)
    return [f"components.{name}.nodes={nodes}", f"components.{name}.tasks_per_node={per_node}"]

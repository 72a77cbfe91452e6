"""``RankContext``: what a workload (and a hook) knows about the rank it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RankContext:
    """One per rank; handed to ``Workload(ctx, **workload_args)`` and to the hooks.

    ``group`` / ``comm`` are the torch.distributed group and mpi4py communicator
    of this rank's component (``comm`` is ``MPI.COMM_SELF`` and ``group`` is
    None in the in-process mode, where each component has one rank).
    ``iteration`` is updated by the executor before each action.
    """

    rank: int
    world_size: int
    component: str
    comp_rank: int
    comp_size: int
    group: Any
    comm: Any
    device: str
    seed: int
    run_dir: Path
    node: str = "localhost"
    node_comm: Any = None  # ranks of this node (any component), for node-local sharing
    world_comm: Any = None  # MPI_COMM_WORLD (None in-process)
    world_group: Any = None  # torch.distributed default group (None in-process)
    comp_ranks: dict[str, list[int]] = field(default_factory=dict)  # global ranks per component
    plan: Any = None  # hetrun.runtime.plan_view.PlanView
    iteration: int = 0
    mode: str = "mpi"  # "mpi" | "inprocess"
    comms: dict[str, Any] = field(default_factory=dict)  # the job's comms: section (codecs)

    @property
    def rank_seed(self) -> int:
        """A per-rank seed derived from the job seed (distinct streams per rank)."""
        return self.seed * 10_007 + self.rank

    @property
    def is_component_leader(self) -> bool:
        return self.comp_rank == 0

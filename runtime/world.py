"""Who am I: the MPI world, this rank's component, node and communicators.

Under ``srun --het-group=0,1,... --mpi=pmix`` every het group is in one
MPI_COMM_WORLD and global ranks are numbered group after group. Under the
local backend, ``mpirun`` starts one app context per component with
``HETRUN_COMPONENT`` set. ``detect_component`` is pure (env + plan + rank) so
it is tested without MPI or Slurm.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hetrun.errors import RuntimeFailure

from . import mpi_wait
from .plan_view import ComponentSpec, PlanView

DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0


def node_name(env: Mapping[str, str] | None = None) -> str:
    """The node this rank runs on; Slurm's name first (emulated nodes share a hostname)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or env.get("HETRUN_NODE") or socket.gethostname()


def _het_group_sizes(env: Mapping[str, str], comps: Sequence[ComponentSpec]) -> list[int]:
    """Tasks of each action component's het group, from Slurm's per-group variables
    (indexed by the component's het group: its plan index), else from the plan."""
    sizes = []
    for comp in comps:
        value = comp.ntasks
        for key in (f"SLURM_STEP_NUM_TASKS_HET_GROUP_{comp.index}", f"SLURM_NTASKS_HET_GROUP_{comp.index}"):
            if env.get(key, "").isdigit():
                value = int(env[key])
                break
        sizes.append(value)
    return sizes


def _forced_component(forced: str, plan: PlanView) -> ComponentSpec:
    if forced.isdigit():
        if int(forced) >= len(plan.components):
            raise RuntimeFailure(f"HETRUN_COMPONENT={forced} but the plan has {len(plan.components)} components")
        comp = plan.components[int(forced)]
    else:
        comp = plan.component(forced)
    if not comp.runs_actions:
        raise RuntimeFailure(
            f"HETRUN_COMPONENT={forced}: component {comp.name!r} runs a command, not actions",
            hint="its ranks start through hetrun.runtime.command_rank, not hetrun.runtime")
    return comp


def detect_component(
    env: Mapping[str, str], plan: PlanView, global_rank: int, world_size: int
) -> tuple[ComponentSpec, int]:
    """Return (component, rank within the component's global rank range start).

    Order of evidence: ``HETRUN_COMPONENT`` (local backend, or an explicit
    override), then Slurm's het groups (global rank ranges), then a plan with a
    single action component. Only action components count: in a mixed job the
    action step spans just their het groups (``srun --het-group=0 : --het-group=2``)
    and numbers its ranks over those groups, in plan order; each command
    component is a step of its own with its own rank space.
    """
    forced = env.get("HETRUN_COMPONENT")
    if forced:
        return _forced_component(forced, plan), -1
    comps = plan.action_components
    if env.get("SLURM_HET_SIZE"):
        sizes = _het_group_sizes(env, comps)
        rank = int(env.get("SLURM_PROCID", global_rank))
        start = 0
        for comp, size in zip(comps, sizes, strict=True):
            if start <= rank < start + size:
                return comp, start
            start += size
        raise RuntimeFailure(
            f"global rank {rank} is outside the het groups' rank ranges of the action components "
            f"({dict(zip([c.name for c in comps], sizes, strict=True))})",
            hint="run the sbatch script rendered for this plan (hetjob.sbatch): one srun over "
                 "the action components' het groups",
        )
    if len(comps) == 1:
        return comps[0], 0
    names = [c.name for c in comps]
    raise RuntimeFailure(
        f"cannot tell which component rank {global_rank}/{world_size} belongs to: "
        f"neither HETRUN_COMPONENT nor SLURM_HET_SIZE is set and the plan has action components {names}",
        hint="start ranks through `hetrun submit` (Slurm or local backend), or set HETRUN_COMPONENT",
    )


def collective_timeout_s(plan: PlanView | None, env: Mapping[str, str] | None = None) -> float:
    """``HETRUN_COLLECTIVE_TIMEOUT`` seconds: process env, then the job's ``env:``, then 120."""
    env = os.environ if env is None else env
    raw = env.get("HETRUN_COLLECTIVE_TIMEOUT") or (
        plan.env.get("HETRUN_COLLECTIVE_TIMEOUT") if plan else None
    )
    if not raw:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError as exc:
        raise RuntimeFailure(
            f"HETRUN_COLLECTIVE_TIMEOUT={raw!r} is not a number of seconds",
            hint="set it in the job's env: section, e.g. HETRUN_COLLECTIVE_TIMEOUT: \"60\"",
        ) from exc
    if value <= 0:
        raise RuntimeFailure(f"HETRUN_COLLECTIVE_TIMEOUT={raw!r} must be > 0 seconds")
    return value


def routable_address() -> str:
    """An address of this host other nodes can reach (not Debian's 127.0.1.1 alias)."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET)
    except OSError:
        infos = []
    for info in infos:
        addr = str(info[4][0])
        if not addr.startswith("127."):
            return addr
    # The interface of the default route; connect() on UDP sends nothing.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            addr = str(s.getsockname()[0])
            if not addr.startswith("127."):
                return addr
    except OSError:
        pass
    return name


@dataclass
class World:
    """MPI communicators and torch.distributed groups for one rank."""

    comm: Any  # MPI.COMM_WORLD
    node_comm: Any  # ranks sharing this node's memory
    comp_comm: Any  # ranks of this component
    rank: int
    size: int
    component: ComponentSpec
    comp_rank: int
    comp_size: int
    node: str
    # global ranks of each component, in plan order
    comp_ranks: dict[str, list[int]]
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    torch_world: Any = None
    torch_groups: dict[str, Any] = field(default_factory=dict)  # this rank's component only
    backend: str = ""
    # Wall-clock times (time.time()) this rank reached each startup stage: the
    # runtime's startup event reports them (where a restart's seconds go).
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def node_rank(self) -> int:
        return int(self.node_comm.Get_rank())

    @property
    def node_size(self) -> int:
        return int(self.node_comm.Get_size())

    def leader_of(self, component: str) -> int:
        return self.comp_ranks[component][0]

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)

    def init_torch(self, use_cuda: bool = False) -> None:
        """torch.distributed: a world group and this rank's component group.

        Rank 0 opens a TCPStore on a port the OS picks (port 0), so two jobs on
        one node never collide, and broadcasts host:port over MPI.
        """
        if self.torch_world is not None:
            return
        self.timings.setdefault("torch_import_start", time.time())
        import torch.distributed as dist

        self.timings.setdefault("torch_imported", time.time())
        timeout = timedelta(seconds=self.timeout_s)
        nodes = mpi_wait.allgather(self.comm, socket.gethostname())
        same_host = len(set(nodes)) == 1
        if same_host:
            # Emulated nodes on one host: loopback is the one interface that works.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        host = os.environ.get("HETRUN_MASTER_ADDR") or (
            "127.0.0.1" if same_host else routable_address()
        )
        store = None
        if self.rank == 0:
            store = dist.TCPStore(host, 0, self.size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            addr = (host, int(store.port))
        else:
            addr = None
        host, port = mpi_wait.bcast(self.comm, addr, root=0)
        if store is None:
            store = dist.TCPStore(host, port, self.size, is_master=False, timeout=timeout)
        self.backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(
            backend=self.backend, store=store, rank=self.rank, world_size=self.size,
            timeout=timeout,
        )
        self.timings["pg_world_ready"] = time.time()
        self.torch_world = dist.group.WORLD
        # Only this rank's own component group: nothing uses another component's
        # group, and with use_local_synchronization only its members take part
        # in creating it (the rest of the world does not wait for it).
        mine = self.component.name
        self.torch_groups[mine] = dist.new_group(
            ranks=self.comp_ranks[mine], timeout=timeout, backend=self.backend,
            use_local_synchronization=True,
        )
        self.timings["groups_ready"] = time.time()

    @property
    def torch_group(self) -> Any:
        return self.torch_groups.get(self.component.name)

    def shutdown(self) -> None:
        if self.torch_world is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.torch_world = None


def build_world(plan: PlanView, env: Mapping[str, str] | None = None) -> World:
    """Initialize MPI (mpi4py) and split the communicators for this rank."""
    env = os.environ if env is None else env
    mpi_start = time.time()
    from mpi4py import MPI  # MPI_Init: PMIx wire-up with every peer

    mpi_ready = time.time()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    comp, _ = detect_component(env, plan, rank, size)
    # Every rank tells every other its component: the ranges are then exact
    # whatever launched us (srun het groups or mpirun app contexts).
    all_comps: Sequence[str] = mpi_wait.allgather(comm, comp.name)
    comp_ranks = {c.name: [r for r, n in enumerate(all_comps) if n == c.name]
                  for c in plan.action_components}
    missing = [name for name, ranks in comp_ranks.items() if not ranks]
    if missing:
        raise RuntimeFailure(
            f"action components {missing} of the plan have no ranks in this MPI world of {size}",
            hint="start one srun over all het groups (--het-group=0,1,...) or one mpirun "
                 "app context per component",
        )
    comp_ranks = {k: v for k, v in comp_ranks.items() if v}
    comp_comm = comm.Split(color=comp.index, key=rank)
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    # Emulated Slurm nodes share one host: split further by node name so
    # "node-local" means what Slurm says, as it will on a real cluster.
    node = node_name(env)
    names = sorted(set(mpi_wait.allgather(shared, node)))
    node_comm = shared.Split(color=names.index(node), key=rank)
    shared.Free()
    return World(
        comm=comm, node_comm=node_comm, comp_comm=comp_comm, rank=rank, size=size,
        component=comp, comp_rank=comp_comm.Get_rank(), comp_size=comp_comm.Get_size(),
        node=node, comp_ranks=comp_ranks, timeout_s=collective_timeout_s(plan, env),
        timings={"mpi_start": mpi_start, "mpi_ready": mpi_ready, "world_ready": time.time()},
    )

"""Where this process sits: rank and world discovery for the public run API.

Launchers announce ranks differently; ``discover()`` reads, in this order:

1. torchrun / torchelastic (and hetrun's command components, which set the
   same names): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
   ``GROUP_RANK``;
2. Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_*``;
3. a Slurm job step (``srun``): ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
   ``SLURM_LOCALID``, ``SLURM_NODEID``. The batch shell itself (no
   ``SLURM_STEP_ID``) is one process, whatever ``--ntasks`` says;
4. otherwise standalone: rank 0 of 1.

``export_torchrun_env`` fills in the torchrun names a plain
``init_process_group()`` (``env://``) reads when another launcher started the
process, so an unchanged DDP script runs under ``srun`` and ``mpirun`` too.
It never overrides what is already set.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from hetrun.errors import RuntimeFailure


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    launcher: str  # "torchrun" | "mpirun" | "slurm" | "standalone"
    job_id: str | None  # Slurm's job id (array task included) when in a Slurm job

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RuntimeFailure(f"${name} is not set", hint="the launcher sets it; do not unset it")
        return default
    if not raw.strip().isdigit():
        raise RuntimeFailure(f"${name}={raw!r} is not a non-negative integer",
                             hint=f"unset {name} or give it the launcher's value")
    return int(raw)


def slurm_job_id() -> str | None:
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def tasks_on_node(tasks_per_node: str, node_index: int) -> int | None:
    """Slurm's ``2(x3),1`` notation: the task count of node ``node_index``."""
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return None
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if node_index < repeat:
            return count
        node_index -= repeat
    return None


def first_host(nodelist: str) -> str | None:
    """The first host of a Slurm hostlist (``n[01-04,7],m2`` -> ``n01``)."""
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist.strip())
    if m is None:
        return None
    return m.group(1) + (m.group(2) or "")


def discover() -> RankEnv:
    job = slurm_job_id()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = _int("RANK"), _int("WORLD_SIZE")
        local = _int("LOCAL_RANK", rank)
        return RankEnv(rank, world, local, _int("LOCAL_WORLD_SIZE", world),
                       _int("GROUP_RANK", 0), "torchrun", job)
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        rank, world = _int("OMPI_COMM_WORLD_RANK"), _int("OMPI_COMM_WORLD_SIZE")
        local, local_world = _int("OMPI_COMM_WORLD_LOCAL_RANK", 0), _int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        return RankEnv(rank, world, local, local_world, _int("OMPI_COMM_WORLD_NODE_RANK", rank // max(1, local_world)),
                       "mpirun", job)
    if job and os.environ.get("SLURM_STEP_ID") is not None and "SLURM_PROCID" in os.environ:
        node = _int("SLURM_NODEID", 0)
        local_world = tasks_on_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""), node) or 1
        return RankEnv(_int("SLURM_PROCID"), _int("SLURM_STEP_NUM_TASKS", _int("SLURM_NTASKS", 1)),
                       _int("SLURM_LOCALID", 0), local_world, node, "slurm", job)
    return RankEnv(0, 1, 0, 1, 0, "standalone", job)


# MASTER_PORTs hetrun derives from a Slurm job id (here and runtime/command_rank.py): 20000 up to
# 31999, below Linux's ephemeral range (32768-60999 by default), where any outgoing connection on
# the node may hold a port (seen: EADDRINUSE on 38656 for a job's store).
PORT_BASE = 20000
PORT_SPAN = 12000


def master_port(job_id: str | None, step_id: str | None) -> int:
    """A port derived from the job and step, so that concurrent jobs sharing a
    node (and successive steps of one job) do not collide (PORT_BASE, PORT_SPAN); 29500 as
    torchrun when there is no job."""
    if not job_id:
        return 29500
    digits = int(re.sub(r"\D", "", job_id) or 0)
    return PORT_BASE + (digits * 16 + int(step_id or 0)) % PORT_SPAN


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _master_addr() -> str:
    override = os.environ.get("HETRUN_MASTER_ADDR")
    if override:
        return override
    host = first_host(os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or "")
    if host:
        try:
            socket.getaddrinfo(host, None)
            return host
        except OSError:
            pass  # emulated nodes (no DNS entry): srun's own address is rank 0's host
    return os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"


def export_torchrun_env(env: RankEnv) -> dict[str, str]:
    """Set the torchrun variables this process lacks; returns what was set.

    Standalone, this makes a world of one, so the script's unconditional
    ``init_process_group()`` works without torchrun (on a free port)."""
    if env.launcher == "torchrun":
        return {}
    port = _free_port() if env.launcher == "standalone" else master_port(env.job_id, os.environ.get("SLURM_STEP_ID"))
    wanted = {"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank),
              "LOCAL_WORLD_SIZE": str(env.local_world_size), "GROUP_RANK": str(env.node_rank),
              "MASTER_ADDR": "127.0.0.1" if env.launcher == "standalone" else _master_addr(),
              "MASTER_PORT": str(port)}
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    return added


def component_name(default: str = "train") -> str:
    """The component this rank belongs to: ``HETRUN_COMPONENT`` (set on every rank of a
    hetrun command component), else ``default``."""
    return os.environ.get("HETRUN_COMPONENT") or default


def event_rank(env: RankEnv) -> int:
    """The rank events carry: in a hetrun command component ``HETRUN_GLOBAL_RANK`` (the
    rank over all components, what the post-mortem and reports key on), else ``env.rank``."""
    raw = os.environ.get("HETRUN_GLOBAL_RANK", "")
    return int(raw) if raw.isdigit() else env.rank

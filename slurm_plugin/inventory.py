"""What the cluster's nodes can hold, from ``sinfo``, for the dag's resource checks.

``node_inventory()`` returns None when no cluster answers (no Slurm tools, or
no controller within the timeout): planning then checks against the spec
alone. It never retries: planning must stay fast, and a missing cluster is a
normal state on a laptop.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from hetrun.dag.action import NodeCapacity

_GPU_RE = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")
_SINFO_FORMAT = "%N|%c|%m|%G|%P|%T|%f"


@dataclass
class SlurmNode:
    """One node as sinfo reports it (all its partitions merged)."""

    name: str
    cpus: int
    mem_mb: int
    gpus: int
    partitions: list[str] = field(default_factory=list)
    state: str = ""
    features: list[str] = field(default_factory=list)
    default_partition: str | None = None


def _gpus(gres: str) -> int:
    return sum(int(m.group(1)) for m in _GPU_RE.finditer(gres or ""))


def parse_sinfo(text: str) -> list[SlurmNode]:
    """Parse ``sinfo -N -h -o '%N|%c|%m|%G|%P|%T|%f'`` (one line per node and partition)."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 7:
            continue
        name, cpus, mem, gres, part, state, feats = parts[:7]
        default = part.endswith("*")
        part = part.rstrip("*")
        node = nodes.get(name)
        if node is None:
            node = nodes[name] = SlurmNode(
                name=name,
                cpus=int(cpus) if cpus.isdigit() else 0,
                mem_mb=int(mem.rstrip("+")) if mem.rstrip("+").isdigit() else 0,
                gpus=_gpus(gres),
                state=state,
                features=[] if feats in ("(null)", "") else feats.split(","),
            )
        if part not in node.partitions:
            node.partitions.append(part)
        if default:
            node.default_partition = part
    return list(nodes.values())


def node_inventory(timeout_s: float = 5.0) -> list[SlurmNode] | None:
    """Every node's capacity, or None when no cluster answers."""
    try:
        proc = subprocess.run(["sinfo", "-N", "-h", "-o", _SINFO_FORMAT], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    nodes = parse_sinfo(proc.stdout)
    return nodes or None


def partition_nodes(nodes: list[SlurmNode], partition: str | None) -> list[SlurmNode]:
    """The nodes of ``partition`` (a comma list allowed), or of the default partition if None."""
    if partition is None:
        return [n for n in nodes if n.default_partition is not None] or nodes
    wanted = set(partition.split(","))
    return [n for n in nodes if wanted.intersection(n.partitions)]


def capacities_of(nodes: list[SlurmNode], partition: str | None) -> list[NodeCapacity] | None:
    """The nodes of ``partition`` (sinfo's ``nodes``) in the dag's terms; None when it has none."""
    chosen = partition_nodes(nodes, partition)
    return [NodeCapacity(n.name, n.cpus, n.gpus, n.mem_mb) for n in chosen] or None


def node_capacities(partition: str | None = None, timeout_s: float = 5.0) -> list[NodeCapacity] | None:
    """Capacities of the nodes a job in ``partition`` can get, in the dag's terms;
    None when no cluster answers (the dag then checks against the spec)."""
    nodes = node_inventory(timeout_s)
    return None if nodes is None else capacities_of(nodes, partition)

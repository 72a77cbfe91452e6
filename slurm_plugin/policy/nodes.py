"""What a policy asks of the nodes themselves, for a cluster whose node files hetrun
writes (`hetrun cluster up --policy`): GRES shard counts for gres.conf and the
node lines, and cgroup.conf for ``cpu.isolation``. On a real cluster these are
hardware descriptions the admin writes (``policy plan`` prints them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetrun.slurm_plugin.policy.desired import isolation_of
from hetrun.slurm_plugin.policy.isolation import (
    CgroupSupport,
    detect_cgroup,
    isolation_problem,
    render_cgroup_conf,
)
from hetrun.slurm_plugin.policy.model import PolicySpec

from hetrun.errors import SlurmError


@dataclass(frozen=True)
class NodeSetup:
    shards_per_gpu: int = 0
    cgroup_conf: str | None = None  # None: no cpu.isolation, task/cgroup not used

    @property
    def gpu_devices(self) -> bool:
        """Whether the GPUs' gres.conf files must be devices: Slurm's gres plugin skips a
        File= that is not one, and then neither sets CUDA_VISIBLE_DEVICES (a shard job
        would not learn its GPU) nor has anything for ConstrainDevices to confine."""
        return self.cgroup_conf is not None or self.shards_per_gpu > 0


def node_setup(policy: PolicySpec, cpus: int, gpus: int, where: str,
               cgroup: CgroupSupport | None = None) -> NodeSetup:
    """``cpus``/``gpus``: per emulated node; ``where``: names the policy in errors;
    ``cgroup``: this host's support (detected when None)."""
    gpu = policy.resources.gpu
    shards = gpu.sharing.shards_per_gpu if gpu and gpu.sharing and gpus else 0
    iso = isolation_of(policy)
    if iso == "none":
        return NodeSetup(shards)
    support = cgroup or detect_cgroup()
    problem = isolation_problem(iso, support)
    if problem:
        raise SlurmError(f"{where}: {problem}")
    host_cpus = os.cpu_count() or 0
    if cpus > host_cpus:
        # task/affinity and the cpuset cgroup map a node's CPUs onto real ones.
        raise SlurmError(f"{where}: cpu.isolation: {iso} binds tasks to real CPUs, but each emulated node "
                         f"claims cpus={cpus} on a host with {host_cpus}",
                         hint=f"start the cluster with --cpus {host_cpus} or fewer, or set cpu.isolation: none")
    return NodeSetup(shards, render_cgroup_conf(support))

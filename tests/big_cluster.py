"""A throw-away 64-node pool beside the shared test cluster: the shape issue 14's
pool tests and benchmarks/pool_trace_replay.py run on.

It is tests/second_cluster.py's SecondCluster with its own ClusterName (``hrpool``),
directory and ports (slurmctld 16827, slurmd 19001-19064), so it can run while the
hrtest2 tests do. Shape: 64 nodes x 4 CPUs x 360 MB; n1-n24 with two ``gpu:a100``,
n25-n48 with two ``gpu:v100`` (fake GRES device files, as `hetrun cluster up`
makes them), n49-n64 without GPUs; partitions gpu-a100, gpu-v100 and cpu, plus
debug (default) and high over every node. 64 x 360 MB fits the 24 GiB machine's
memory check; jobs must ask for little memory (``--mem-per-cpu=80M``).
"""

from __future__ import annotations

from pathlib import Path

from second_cluster import SecondCluster

NAME = "hrpool"
GPU_TYPES = ("a100", "v100")
SHAPE: dict[str, object] = {"cpus": 4, "gpus": 2, "mem_mb": 360, "gpu_types": GPU_TYPES, "cpu_nodes": 16}


class BigPool(SecondCluster):
    name = NAME
    directory = Path("/var/lib/hetrun-hrpool")
    ctld_port = 16827
    first_node_port = 19001

    def __init__(self, nodes: int = 64, policy: Path | None = None, **shape: object) -> None:
        super().__init__(nodes, policy, **{**SHAPE, **shape})

    def wait_idle(self, timeout: float = 180) -> None:
        # 64 slurmd register one by one with a controller on a shared 2-core host.
        super().wait_idle(timeout)

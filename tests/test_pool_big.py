"""The 64-node pool (tests/big_cluster.py) comes up with two GPU types and its
partitions, and `hetrun pool --json` run against it (SLURM_CONF) sees both types.

Start-up time and memory of this pool are in benchmarks/pool.md, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from big_cluster import GPU_TYPES, BigPool

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def pool(slurm_cluster) -> Iterator[BigPool]:  # type: ignore[no-untyped-def]
    p = BigPool()
    try:
        p.start()
        yield p
    finally:
        p.stop()


def test_sixty_four_nodes_come_up_idle_in_their_partitions(pool: BigPool) -> None:
    lines = pool.run("sinfo", "-h", "-N", "-o", "%N %P %T %G").stdout.split("\n")
    rows = [ln.split() for ln in lines if ln.strip()]
    by_partition: dict[str, set[str]] = {}
    for node, partition, state, _gres in rows:
        assert state == "idle", (node, state)
        by_partition.setdefault(partition.rstrip("*"), set()).add(node)
    assert len(by_partition["debug"]) == len(by_partition["high"]) == 64
    assert len(by_partition["gpu-a100"]) == len(by_partition["gpu-v100"]) == 24
    assert len(by_partition["cpu"]) == 16
    assert not by_partition["cpu"] & (by_partition["gpu-a100"] | by_partition["gpu-v100"])


def test_hetrun_pool_json_lists_both_gpu_types(pool: BigPool) -> None:
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "pool", "--json"], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "SLURM_CONF": str(pool.cfg.slurm_conf)})
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    gres = {(r["partition"], r["gres"]): r for r in rows}
    for gpu_type in GPU_TYPES:
        row = gres[(f"gpu-{gpu_type}", f"gpu:{gpu_type}")]
        assert (row["node_total"], row["gpus_total"], row["gpus_alloc"]) == (24, 48, 0)
        assert gres[("debug", f"gpu:{gpu_type}")]["gpus_total"] == 48
    assert gres[("cpu", "-")]["cpus_total"] == 16 * 4

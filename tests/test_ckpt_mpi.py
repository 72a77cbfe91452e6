"""The store across real Open MPI ranks: every rank writes its shard, one
manifest commits them (over a duplicated communicator, from the writer
threads), node-local + shared tiers, and restore agrees on a checkpoint every
rank can verify: one rank's missing chunk moves ALL ranks back together."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hetrun.runtime.mpi_launch import loopback_mpi_env, mpirun_argv
from setup_tools import MPIRUN

pytestmark = [pytest.mark.mpi, MPIRUN]

SCRIPT = textwrap.dedent("""
    import sys, torch
    from mpi4py import MPI
    from hetrun.runtime.ckpt import open_store, tiers_for
    from hetrun.runtime.ckpt.collective import MPICollective
    from hetrun.runtime.ckpt.objects import Tier
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    root = sys.argv[1]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    shared, local = f"{root}/shared", f"{root}/local-{rank % 2}"   # two "nodes"
    coll = MPICollective(comm)

    def state(step):
        g = torch.Generator().manual_seed(100 * rank + step)
        return {"w": torch.randn(1 << 15, generator=g), "rank": rank, "step": step}

    w = CheckpointWriter(tiers_for(shared, local), collective=coll, chunk_bytes=1 << 14, keep=5)
    for step in (1, 2, 3):
        w.save(step, state(step))
        r = w.wait()
        assert r.ok and r.drained == ["local", "shared"], r
    w.close()

    res = open_store(shared, local).restore(coll)
    assert res.step == 3 and res.state["rank"] == rank and torch.equal(res.state["w"], state(3)["w"])
    assert res.tier == "local"  # each "node" committed its own local copy
    assert Tier(local).manifest_steps() == Tier(shared).manifest_steps() == [1, 2, 3]

    # Rank 1 loses a chunk of step 3 in both tiers: every rank must fall back to step 2.
    if rank == 1:
        for tier in (Tier(shared), Tier(local)):
            man = tier.read_manifest(3)
            shard = tier.read_shard(man["shards"][1]["path"], man["shards"][1]["sha256"], "test")
            tier.object_path(shard["tensors"][0]["chunks"][0][0]).unlink()
    comm.Barrier()
    res = open_store(shared, local).restore(coll)
    assert res.step == 2 and torch.equal(res.state["w"], state(2)["w"]), res.step
    assert res.skipped and res.skipped[0][0] == 3 and "rank 1" in res.skipped[0][1]
    print(f"rank {rank} ok", flush=True)
""")


def test_three_ranks_commit_restore_and_fall_back_together(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    r = subprocess.run(mpirun_argv(3, [sys.executable, str(script), str(tmp_path)]),
                       env=loopback_mpi_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(re.findall(r"rank \d ok", r.stdout)) == ["rank 0 ok", "rank 1 ok", "rank 2 ok"]

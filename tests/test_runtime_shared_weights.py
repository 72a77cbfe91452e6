"""Node-local shared weights with real Open MPI ranks: one copy, read by every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.runtime.mpi_launch import mpirun_argv
from runtime_toy import mpi_env

pytestmark = pytest.mark.mpi

PROBE = r'''
import json, sys, torch
from mpi4py import MPI
from hetrun.runtime.shared_weights import SharedWeights
from hetrun.errors import RuntimeFailure

comm = MPI.COMM_WORLD
node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
g = torch.Generator().manual_seed(7)
expected = {"w": torch.randn(8 << 20, generator=g), "b": torch.arange(10, dtype=torch.int64)}
sw = SharedWeights.create(node, expected if node.Get_rank() == 0 else None)
ok_initial = all(torch.equal(sw.tensors[k], expected[k]) for k in expected)
total = float(sw.tensors["w"].sum())  # touch every page
with open("/proc/self/smaps_rollup") as fh:
    mem = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in fh.read().splitlines()[1:]}
comm.Barrier()
if node.Get_rank() == 0:
    sw.publish({"w": expected["w"] * 2, "b": expected["b"] + 1}, version=5)
comm.Barrier()
version, snap = sw.read_consistent()
ok_published = version == 5 and torch.equal(snap["b"], expected["b"] + 1) and torch.equal(
    sw.tensors["w"], expected["w"] * 2)
try:
    if node.Get_rank() != 0:
        sw.publish(snap, 6)
    refused = node.Get_rank() == 0
except RuntimeFailure:
    refused = True
rows = comm.gather({"rank": comm.Get_rank(), "ok_initial": ok_initial, "ok_published": ok_published,
                    "refused": refused, "rss": mem["Rss"], "pss": mem["Pss"]}, root=0)
comm.Barrier()
sw.free()
if comm.Get_rank() == 0:
    json.dump(rows, open(sys.argv[1], "w"))
'''


def test_ranks_share_one_copy(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "out.json"
    n = 3
    proc = subprocess.run(mpirun_argv(n, [sys.executable, str(probe), str(out)]), env=mpi_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == n
    assert all(r["ok_initial"] and r["ok_published"] and r["refused"] for r in rows), rows
    # 32 MiB of weights mapped by 3 ranks: each rank's Pss counts only a third
    # of those pages, so Rss - Pss >= ~2/3 of 32 MiB on every rank.
    weights = (8 << 20) * 4
    for r in rows:
        assert r["rss"] - r["pss"] > 0.5 * weights * (1 - 1 / n), r


def test_cuda_tensors_are_refused_clearly() -> None:
    import torch
    from hetrun.runtime.shared_weights import SharedWeights

    from hetrun.errors import RuntimeFailure

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA-IPC refusal needs a CUDA tensor")
    from mpi4py import MPI

    with pytest.raises(RuntimeFailure, match="CUDA IPC"):
        SharedWeights.create(MPI.COMM_SELF, {"w": torch.ones(3, device="cuda")})

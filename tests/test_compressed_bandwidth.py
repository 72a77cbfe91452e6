"""Adaptive compression: link measurement, break-even model, drift re-calibration (real MPI ranks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mpi_helpers import needs_mpirun, run_ranks


def test_break_even_model() -> None:
    from hetrun.runtime.comms.bandwidth import CodecSpeed, break_even_bandwidth

    # 4 GB/s both ways, 28.4x smaller: pays below (1 - 1/28.4) / (2 / 4e9) = 1.93 GB/s
    assert break_even_bandwidth(CodecSpeed(4e9, 4e9, 28.4)) == pytest.approx(1.93e9, rel=1e-2)
    # a slower codec pays on fewer links
    assert break_even_bandwidth(CodecSpeed(1e9, 1e9, 28.4)) < 0.5e9
    # int8 (3.9x) pays on fewer links than 1 bit at the same speed
    assert break_even_bandwidth(CodecSpeed(4e9, 4e9, 3.9)) < break_even_bandwidth(
        CodecSpeed(4e9, 4e9, 28.4)
    )


def test_torch_backend_is_a_clear_error() -> None:
    from hetrun.dag.errors import HetrunError
    from hetrun.runtime.comms.bandwidth import calibrate

    class TorchComm:
        backend, rank, size, mpi_comm = "torch", 0, 1, None

    with pytest.raises(HetrunError, match=r"torch\.distributed"):
        calibrate(TorchComm())


def _body(out_dir: str) -> None:
    from hetrun.runtime.comms.alltoall import AllToAllComm
    from hetrun.runtime.comms.bandwidth import AdaptiveCompression, calibrate
    from hetrun.runtime.comms.compressed import exchange_for
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = AllToAllComm.from_mpi(world)
    policy = calibrate(comm, "onebit", nbytes=1 << 20)
    bw, raw, comp = policy.bandwidth, policy.raw_s, policy.compressed_s  # type: ignore[attr-defined]
    assert len(bw) == size and all(len(r) == size for r in bw)
    assert all(bw[s][d] > 1e6 for s in range(size) for d in range(size) if s != d), bw
    assert 0 < policy.break_even_bps < float("inf")  # type: ignore[attr-defined]
    # the decision follows the timings, and every rank holds the same matrix
    for s in range(size):
        for d in range(size):
            assert policy.compress[s][d] == (s != d and comp[s][d] < 0.9 * raw[s][d])
    assert world.allgather(policy.compress) == [policy.compress] * size
    assert exchange_for(comm).policy is policy

    ad = AdaptiveCompression(comm, "onebit", window=2, drift=0.5)
    for _ in range(4):  # steady: no re-calibration
        comm.stats["seconds"] += 0.01
        comm.stats["calls"] += 1
        assert not ad.step()
    # one rank sees the all-to-all become 20x slower: all ranks re-measure together
    for _ in range(2):
        comm.stats["seconds"] += 0.2 if rank == 0 else 0.01
        comm.stats["calls"] += 1
        again = ad.step()
    assert again and ad.recalibrations == 1
    Path(out_dir, f"ok-{rank}").write_text(str(size))


@pytest.mark.mpi
@needs_mpirun
def test_calibrate_on_real_ranks(tmp_path: Path) -> None:
    run_ranks(3, __file__, str(tmp_path), timeout=180)
    assert sorted(p.name for p in tmp_path.glob("ok-*")) == ["ok-0", "ok-1", "ok-2"]


if __name__ == "__main__":
    _body(sys.argv[1])

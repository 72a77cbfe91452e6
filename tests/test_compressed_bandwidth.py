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
    from hetrun.runtime.comms.bandwidth import calibrate

    from hetrun.errors import HetrunError

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
    # (unless the whole-exchange check vetoed it: then every pair goes raw, and says why)
    vetoed = "whole exchange" in policy.reason
    for s in range(size):
        for d in range(size):
            follows = s != d and comp[s][d] < 0.9 * raw[s][d]
            assert policy.compress[s][d] == (follows and not vetoed)
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

    _whole_exchange_checks(comm, rank, size)
    Path(out_dir, f"ok-{rank}").write_text(str(size))


def _whole_exchange_checks(comm, rank: int, size: int) -> None:
    """The whole-exchange veto: real timings, then forced outcomes through a fake timer."""
    import hetrun.runtime.comms.bandwidth as bwmod
    from hetrun.kernels.codecs.registry import get_codec
    from hetrun.runtime.comms.compressed import exchange_for
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    before = dict(comm.stats)
    exact_s, comp_s = bwmod.measure_exchange_times(comm, get_codec("onebit"), 1 << 18, reps=2)
    assert 0 < exact_s < 10 and 0 < comp_s < 10
    assert comm.stats == before, "calibration exchanges must not count as the job's traffic"
    # real timings: whenever compression stays on, the whole exchange confirmed it
    pol = bwmod.calibrate(comm, "onebit", nbytes=1 << 20, exchange_bytes=1 << 18)
    if any(any(r) for r in pol.compress):
        ex, cp = pol.exchange_s  # type: ignore[attr-defined]
        assert cp <= 0.9 * ex

    real = bwmod.measure_exchange_times
    calls = []

    def fake_exchange_times(comm_, codec, nbytes_per_peer, *, reps=3):
        calls.append(nbytes_per_peer)
        return fake_result[0]

    bwmod.measure_exchange_times = fake_exchange_times
    try:
        # pairs forced on (margin -10: on whenever compressed < 11x raw); whole exchange 20x slower
        fake_result = [(1.0, 20.0)]
        pol = bwmod.calibrate(comm, "onebit", nbytes=1 << 20, margin=-10.0)
        assert not any(any(r) for r in pol.compress) and "whole exchange" in pol.reason, pol.reason
        assert exchange_for(comm).policy is pol
        fake_result = [(1.0, 0.5)]
        pol = bwmod.calibrate(comm, "onebit", nbytes=1 << 20, margin=-10.0)
        assert all(pol.compress[s][d] == (s != d) for s in range(size) for d in range(size))

        # after its first window, AdaptiveCompression re-checks at the real exchange size
        calls.clear()
        ad = bwmod.AdaptiveCompression(comm, "onebit", window=2, margin=-10.0, nbytes=1 << 20)
        assert ad._compressing()
        fake_result = [(1.0, 20.0)]  # the real exchanges turn out not to pay
        per_call = (size - 1) * (1 << 20) * (rank + 1)  # ranks differ: the check uses the mean
        for _ in range(2):
            comm.stats["raw_bytes"] += per_call
            comm.stats["calls"] += 1
            assert not ad.step()
        assert ad.rechecks == 1 and not ad._compressing()
        assert exchange_for(comm).policy is ad.policy and "whole exchange" in ad.policy.reason
        mean_per_peer = sum((1 << 20) * (r + 1) for r in range(size)) // size
        assert calls[-1] == mean_per_peer
        assert world.allgather(calls[-1]) == [mean_per_peer] * size
    finally:
        bwmod.measure_exchange_times = real


@pytest.mark.mpi
@needs_mpirun
def test_calibrate_on_real_ranks(tmp_path: Path) -> None:
    run_ranks(3, __file__, str(tmp_path), timeout=180)
    assert sorted(p.name for p in tmp_path.glob("ok-*")) == ["ok-0", "ok-1", "ok-2"]


if __name__ == "__main__":
    _body(sys.argv[1])

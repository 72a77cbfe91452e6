"""1-bit all-reduce with error feedback on real Open MPI ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mpi_helpers import needs_mpirun, run_ranks


def _grad(rank: int, shape: tuple[int, ...], seed: int):
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(100 * seed + rank))


def _avg_err(acc, exact, steps: int) -> float:
    import torch

    return float(torch.cat([(a / steps - e).reshape(-1) for a, e in zip(acc, exact, strict=True)]).norm())


def _body(out_dir: str) -> None:
    import torch
    from hetrun.runtime.comms.allreduce_1bit import OneBitAllReduce
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    shapes = [(33, 7), (1000,), (5,)]
    ar = OneBitAllReduce(world)
    # The same gradient every step: the running mean of the results must approach
    # the exact mean (error feedback), far closer than one 1-bit step is.
    grads = [_grad(rank, s, i) for i, s in enumerate(shapes)]
    exact = [sum(_grad(r, s, i) for r in range(size)) / size for i, s in enumerate(shapes)]
    steps = 40
    acc = [torch.zeros(s) for s in shapes]
    first_err = None
    for step in range(steps):
        ts = [g.clone() for g in grads]
        ar.allreduce_mean_(ts)
        # identical on every rank
        flat = torch.cat([t.reshape(-1) for t in ts])
        assert all(torch.equal(flat, other) for other in world.allgather(flat))
        err = float(torch.cat([(t - e).reshape(-1) for t, e in zip(ts, exact, strict=True)]).norm())
        if step == 0:
            first_err = err
        for a, t in zip(acc, ts, strict=True):
            a += t
        if step + 1 == 10:
            err10 = _avg_err(acc, exact, 10)
    ref_norm = float(torch.cat([e.reshape(-1) for e in exact]).norm())
    avg_err = _avg_err(acc, exact, steps)
    assert first_err is not None and first_err > 0.3 * ref_norm, (first_err, ref_norm)  # 1 bit is coarse
    # ...but feedback corrects it: the error of the running mean falls like 1/steps
    # (without feedback it would stay at the one-step bias, ~first_err)
    assert avg_err < 0.3 * first_err, (avg_err, first_err)
    assert avg_err < 0.5 * err10, (avg_err, err10)
    n = sum(g.numel() for g in grads)
    assert ar.bytes_sent < steps * 2 * n * 4 / 20  # > 20x fewer bytes than fp32 ring traffic
    Path(out_dir, f"ok-{rank}").write_text(f"{avg_err / ref_norm:.4f}")


@pytest.mark.mpi
@needs_mpirun
def test_onebit_allreduce_converges_to_the_mean(tmp_path: Path) -> None:
    run_ranks(3, __file__, str(tmp_path), timeout=180)
    assert len(list(tmp_path.glob("ok-*"))) == 3


if __name__ == "__main__":
    _body(sys.argv[1])

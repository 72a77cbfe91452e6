"""The exact expert-parallel all-to-all, run with real Open MPI ranks.

pytest starts ``mpirun`` on this very file; run as a script it is the rank
body (``python tests/test_alltoall.py mpi|torch``), which checks every rank's
result and gradient against a reference computed from all ranks' data, which
each rank can rebuild locally because the data are seeded by rank.
"""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path

import pytest
from mpi_helpers import needs_mpirun, open_alltoall_comm, run_ranks

# ---------------------------------------------------------------- rank body


def _splits_for(rank: int, size: int, case: int) -> list[int]:
    """Seeded split sizes per (sender, case); zeros on purpose."""
    rng = random.Random(1000 * case + rank)
    if case == 0:
        return [rng.randint(0, 5) for _ in range(size)]
    if case == 1:  # rank 0 sends nothing at all, everyone sends nothing to the last rank
        return [0] * size if rank == 0 else [rng.randint(1, 4) for _ in range(size - 1)] + [0]
    return [0] * size  # nobody sends anything


def _rows_for(rank: int, size: int, case: int, shape: tuple[int, ...], dtype):
    import torch

    n = sum(_splits_for(rank, size, case))
    g = torch.Generator().manual_seed(7 * case + rank)
    x = torch.randn((n, *shape), generator=g, dtype=torch.float64)
    return x.to(dtype)


def _reference(size: int, case: int, shape: tuple[int, ...], dtype, requires_grad: bool):
    """All ranks' inputs and, per receiver, the rows it should get (built with torch indexing)."""
    import torch

    xs = [_rows_for(r, size, case, shape, dtype) for r in range(size)]
    if requires_grad:
        xs = [x.clone().requires_grad_(True) for x in xs]
    outs = []
    for dst in range(size):
        parts = []
        for src in range(size):
            splits = _splits_for(src, size, case)
            lo = sum(splits[:dst])
            parts.append(xs[src][lo : lo + splits[dst]])
        outs.append(torch.cat(parts, dim=0))
    return xs, outs


def _body(backend: str, out_dir: str) -> None:
    import torch
    from hetrun.runtime.comms.alltoall import (
        AllToAllComm,
        all_to_all,
        exact_all_to_all,
        exchange_splits,
    )
    from mpi4py import MPI

    from hetrun.errors import HetrunError, RuntimeFailure

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = open_alltoall_comm(backend, world)
    assert (comm.rank, comm.size) == (rank, size)

    for case in (0, 1, 2):
        sends = _splits_for(rank, size, case)
        recvs = exchange_splits(sends, comm)
        expected_recvs = [_splits_for(src, size, case)[rank] for src in range(size)]
        assert recvs == expected_recvs, (case, recvs, expected_recvs)

        # Values for several dtypes and row shapes, no autograd.
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
            for shape in ((3,), (2, 5), ()):
                x = _rows_for(rank, size, case, shape, dtype)
                out = exact_all_to_all(x, sends, recvs, comm)
                _, ref_outs = _reference(size, case, shape, dtype, requires_grad=False)
                assert out.dtype == dtype and out.shape == ref_outs[rank].shape, (
                    case,
                    dtype,
                    out.shape,
                )
                assert torch.equal(out, ref_outs[rank]), (case, dtype, shape)

        # Autograd: the gradient of sum(out * w) must equal the single-process reference.
        shape = (4,)
        x = _rows_for(rank, size, case, shape, torch.float64).requires_grad_(True)
        out = all_to_all(x, sends, recvs, comm)
        ref_xs, ref_outs = _reference(size, case, shape, torch.float64, requires_grad=True)
        weights = [
            torch.randn(o.shape, generator=torch.Generator().manual_seed(99 + d), dtype=o.dtype)
            for d, o in enumerate(ref_outs)
        ]
        (out * weights[rank]).sum().backward()
        sum((o * w).sum() for o, w in zip(ref_outs, weights, strict=True)).backward()
        assert torch.equal(out.detach(), ref_outs[rank].detach())
        assert x.grad is not None and torch.allclose(x.grad, ref_xs[rank].grad, atol=1e-12)

    # A dispatch followed by the inverse combine is the identity, gradients included.
    sends = _splits_for(rank, size, 0)
    recvs = exchange_splits(sends, comm)
    x = _rows_for(rank, size, 0, (6,), torch.float32).requires_grad_(True)
    there = all_to_all(x, sends, recvs, comm)
    back = all_to_all(there * 2.0, recvs, sends, comm)
    assert torch.equal(back, 2.0 * x.detach())
    back.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))

    # Bad splits are a clear error, raised before any rank enters the collective.
    try:
        all_to_all(x, [*sends, 1], recvs, comm)
    except RuntimeFailure as err:
        assert "send_splits" in str(err) and f"{size} ranks" in str(err)
    else:
        raise AssertionError("wrong-length splits accepted")
    try:
        exact_all_to_all(x, [s + 1 for s in sends], recvs, comm)
    except RuntimeFailure as err:
        assert "add up to" in str(err)
    else:
        raise AssertionError("splits not matching x accepted")

    # A codec hands the exchange (and the backward one) to the compressed module.
    calls: list[tuple[str, str, str, list[int], list[int]]] = []

    def fake_compressed_all_to_all(x, send_splits, recv_splits, comm, *, codec, direction,
                                   stream="unset"):
        calls.append((codec, direction, stream, list(send_splits), list(recv_splits)))
        return exact_all_to_all(x, send_splits, recv_splits, comm)

    saved = sys.modules.get("hetrun.runtime.comms.compressed")
    fake = types.ModuleType("hetrun.runtime.comms.compressed")
    fake.compressed_all_to_all = fake_compressed_all_to_all  # type: ignore[attr-defined]
    sys.modules["hetrun.runtime.comms.compressed"] = fake
    try:
        x.grad = None
        out = all_to_all(x, sends, recvs, comm, codec="int8", backward_codec="onebit_ef",
                         stream="moe0.dispatch")
        out.sum().backward()
        assert calls == [
            ("int8", "forward", "moe0.dispatch", sends, recvs),
            ("onebit_ef", "backward", "moe0.dispatch", recvs, sends),
        ]
        # Without a stream the codec's own default applies; exact backward skips the codec.
        calls.clear()
        x.grad = None
        all_to_all(x, sends, recvs, comm, codec="int8").sum().backward()
        assert calls == [("int8", "forward", "unset", sends, recvs)]
        assert torch.equal(x.grad, torch.ones_like(x))
        # Without the module a codec is an error, never a silent exact fallback.
        sys.modules["hetrun.runtime.comms.compressed"] = None  # type: ignore[assignment]
        try:
            all_to_all(x, sends, recvs, comm, codec="int8")
        except HetrunError as err:
            assert "compressed codecs are unavailable" in str(err)
        else:
            raise AssertionError("codec without the compressed module accepted")
    finally:
        if saved is None:
            sys.modules.pop("hetrun.runtime.comms.compressed", None)
        else:
            sys.modules["hetrun.runtime.comms.compressed"] = saved

    if backend == "mpi":
        # The plain blocking MPI_Alltoallv path gives the same rows.
        blocking = AllToAllComm.from_mpi(world, poll="block")
        x = _rows_for(rank, size, 0, (3,), torch.float32)
        _, ref_outs = _reference(size, 0, (3,), torch.float32, requires_grad=False)
        assert torch.equal(exact_all_to_all(x, sends, recvs, blocking), ref_outs[rank])
        blocking.close()
        try:
            AllToAllComm.from_mpi(world, poll="spin")
        except HetrunError as err:
            assert "poll='spin'" in str(err)
        else:
            raise AssertionError("unknown poll mode accepted")

    assert comm.stats["calls"] > 0 and comm.stats["seconds"] > 0
    comm.close()
    if backend == "torch":
        import torch.distributed as dist

        dist.destroy_process_group()
    # A file per rank: mpirun may interleave the ranks' stdout lines.
    Path(out_dir, f"ok-{rank}").write_text(f"{rank}/{size} {backend}")


# ---------------------------------------------------------------- pytest side

@pytest.mark.mpi
@needs_mpirun
@pytest.mark.parametrize("backend", ["mpi", "torch"])
@pytest.mark.parametrize("np_", [1, 2, 4])
def test_all_to_all_matches_reference(np_: int, backend: str, tmp_path: Path) -> None:
    run_ranks(np_, str(Path(__file__).resolve()), backend, str(tmp_path), timeout=120)
    done = sorted(p.read_text() for p in tmp_path.glob("ok-*"))
    assert done == [f"{r}/{np_} {backend}" for r in range(np_)]


if __name__ == "__main__":
    _body(sys.argv[1], sys.argv[2])

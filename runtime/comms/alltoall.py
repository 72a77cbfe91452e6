"""Exact expert-parallel all-to-all with variable split sizes, autograd-aware.

MoE dispatch sends each rank's tokens (rows of ``x``) to the ranks that own
their experts; combine sends the expert outputs back. Both are one
``all_to_all`` here: rows ``x[sum(send_splits[:p]) : sum(send_splits[:p+1])]``
go to peer ``p``, and the result holds ``recv_splits[p]`` rows from each peer
``p`` in rank order. Its backward is the same exchange with the splits swapped.

Two transports behind one wrapper, :class:`AllToAllComm`:

- an mpi4py communicator (CPU): one ``Alltoallv`` on contiguous buffers, rows
  described by a contiguous MPI datatype so counts stay small however wide a
  row is and any torch dtype (bf16 included) travels as raw bytes;
- a ``torch.distributed`` group (NCCL on GPUs, gloo on CPU):
  ``dist.all_to_all_single`` with split sizes.

A codec other than ``None``/``"none"`` hands the exchange to
``hetrun.runtime.comms.compressed.compressed_all_to_all`` (kernels layer); this
module never falls back silently to the exact path when that is unavailable.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

import torch
from hetrun.runtime import mpi_wait

from hetrun.errors import HetrunError, RuntimeFailure

__all__ = [
    "AllToAllComm",
    "all_to_all",
    "exact_all_to_all",
    "exchange_splits",
]

_DIRECTIONS = ("forward", "backward")
_POLLS = ("polite", "block")


class AllToAllComm:
    """The group of ranks an expert-parallel all-to-all runs over.

    Build it with :meth:`from_mpi` (an mpi4py communicator) or
    :meth:`from_torch` (a torch.distributed process group, ``None`` meaning the
    default group). ``backend`` is ``"mpi"`` or ``"torch"``; ``mpi_comm`` and
    ``group`` are exposed for the compressed codecs, which use the same
    transport. ``stats`` accumulates seconds and bytes of exact exchanges so a
    workload or benchmark can report the all-to-all share of a step.
    """

    def __init__(
        self,
        *,
        mpi_comm: Any | None = None,
        group: Any | None = None,
        use_torch: bool = False,
        device: torch.device | str | None = None,
        poll: str = "polite",
    ) -> None:
        if mpi_comm is not None and use_torch:
            raise HetrunError(
                "AllToAllComm got both an mpi4py communicator and a torch.distributed group",
                hint="build it with AllToAllComm.from_mpi(comm) or AllToAllComm.from_torch(group)",
            )
        if mpi_comm is None and not use_torch:
            raise HetrunError(
                "AllToAllComm needs an mpi4py communicator or a torch.distributed group",
                hint="build it with AllToAllComm.from_mpi(comm) or AllToAllComm.from_torch(group)",
            )
        if poll not in _POLLS:
            raise HetrunError(
                f"AllToAllComm: poll={poll!r} is not one of {list(_POLLS)}",
                hint="polite: sleep between progress polls (shared cores); block: MPI_Alltoallv",
            )
        self.poll = poll
        self.mpi_comm: Any = mpi_comm
        self.group = group
        self.backend = "mpi" if mpi_comm is not None else "torch"
        if mpi_comm is not None:
            self.rank = int(mpi_comm.Get_rank())
            self.size = int(mpi_comm.Get_size())
        else:
            import torch.distributed as dist

            if not dist.is_initialized():
                raise HetrunError(
                    "AllToAllComm.from_torch: torch.distributed is not initialised",
                    hint="call torch.distributed.init_process_group first "
                    "(the runtime does this and puts the group in RankContext)",
                )
            self.rank = int(dist.get_rank(group))
            self.size = int(dist.get_world_size(group))
        self.device = torch.device(device) if device is not None else None
        self.stats: dict[str, float] = {"seconds": 0.0, "bytes_sent": 0.0, "calls": 0.0, "raw_bytes": 0.0}
        # Contiguous MPI datatypes, one per row width in bytes, committed once.
        self._row_types: dict[int, Any] = {}

    @classmethod
    def from_mpi(cls, comm: Any, poll: str = "polite") -> AllToAllComm:
        """``poll``: ``"polite"`` (non-blocking exchange, sleeps between polls while waiting) or
        ``"block"`` (plain ``MPI_Alltoallv``, which spins a core while it waits)."""
        return cls(mpi_comm=comm, poll=poll)

    @classmethod
    def from_torch(
        cls, group: Any | None = None, device: torch.device | str | None = None
    ) -> AllToAllComm:
        return cls(group=group, use_torch=True, device=device)

    def reset_stats(self) -> None:
        self.stats = {"seconds": 0.0, "bytes_sent": 0.0, "calls": 0.0, "raw_bytes": 0.0}

    def row_type(self, row_bytes: int) -> Any:
        """The committed MPI datatype for one row of ``row_bytes`` bytes."""
        dtype = self._row_types.get(row_bytes)
        if dtype is None:
            from mpi4py import MPI

            dtype = MPI.BYTE.Create_contiguous(row_bytes)
            dtype.Commit()
            self._row_types[row_bytes] = dtype
        return dtype

    def close(self) -> None:
        """Free the MPI datatypes this wrapper created (the communicator is not ours)."""
        for dtype in self._row_types.values():
            dtype.Free()
        self._row_types.clear()

    def __repr__(self) -> str:
        return f"AllToAllComm(backend={self.backend!r}, rank={self.rank}, size={self.size})"


def _check_splits(name: str, splits: Sequence[int], comm: AllToAllComm) -> list[int]:
    out = [int(s) for s in splits]
    if len(out) != comm.size:
        raise RuntimeFailure(
            f"all_to_all on rank {comm.rank}: {name} has {len(out)} entries {out}, "
            f"but the group has {comm.size} ranks",
            hint=f"give one split size per rank of the group ({comm.size} entries)",
        )
    if any(s < 0 for s in out) or any(o != s for o, s in zip(out, splits, strict=True)):
        raise RuntimeFailure(
            f"all_to_all on rank {comm.rank}: {name} {list(splits)} must be non-negative integers",
            hint="split sizes count rows of the first dimension",
        )
    return out


def exchange_splits(send_splits: Sequence[int], comm: AllToAllComm) -> list[int]:
    """Tell every peer how many rows it will get from us; return how many we get from each.

    ``send_splits[p]`` rows go to peer ``p``; the result's entry ``p`` is what
    peer ``p`` put in its ``send_splits[comm.rank]``. Collective over ``comm``.
    """
    sends = _check_splits("send_splits", send_splits, comm)
    if comm.backend == "mpi":
        import numpy as np

        send_buf = np.asarray(sends, dtype=np.int64)
        recv_buf = np.empty(comm.size, dtype=np.int64)
        if comm.poll == "block":
            comm.mpi_comm.Alltoall(send_buf, recv_buf)
        else:
            mpi_wait.wait_politely(comm.mpi_comm.Ialltoall(send_buf, recv_buf), max_sleep=250e-6)
        return [int(v) for v in recv_buf]
    import torch.distributed as dist

    device = comm.device or torch.device("cpu")
    send_t = torch.tensor(sends, dtype=torch.int64, device=device)
    recv_t = torch.empty(comm.size, dtype=torch.int64, device=device)
    dist.all_to_all_single(recv_t, send_t, group=comm.group)
    return [int(v) for v in recv_t.tolist()]


def _row_elems(x: torch.Tensor) -> int:
    # From the shape, not from a row: a rank that sends no rows still needs the width.
    return math.prod(x.shape[1:])


def _mpi_all_to_all(
    x: torch.Tensor, sends: list[int], recvs: list[int], comm: AllToAllComm
) -> torch.Tensor:
    rows_out = sum(recvs)
    out = torch.empty((rows_out, *x.shape[1:]), dtype=x.dtype)
    row_bytes = _row_elems(x) * x.element_size()
    if row_bytes == 0:
        return out  # zero-width rows carry nothing; shapes alone are the answer
    # Rows travel as raw bytes so every torch dtype (bf16 has no numpy twin) works.
    send_bytes = x.detach().contiguous().view(torch.uint8).reshape(x.shape[0], row_bytes).numpy()
    recv_bytes = out.view(torch.uint8).reshape(rows_out, row_bytes).numpy()
    send_displs = [0] * comm.size
    recv_displs = [0] * comm.size
    for p in range(1, comm.size):
        send_displs[p] = send_displs[p - 1] + sends[p - 1]
        recv_displs[p] = recv_displs[p - 1] + recvs[p - 1]
    row_t = comm.row_type(row_bytes)
    send_spec = [send_bytes, (sends, send_displs), row_t]
    recv_spec = [recv_bytes, (recvs, recv_displs), row_t]
    if comm.poll == "block":
        comm.mpi_comm.Alltoallv(send_spec, recv_spec)
    else:
        # Expert-parallel ranks are often oversubscribed: a blocking wait would
        # busy-poll a core the peer still computing its experts needs (every op
        # of that rank ran ~3x slower on 2 shared cores). The sleep cap keeps a
        # long exchange's overshoot at ~0.25 ms.
        mpi_wait.wait_politely(comm.mpi_comm.Ialltoallv(send_spec, recv_spec), max_sleep=250e-6)
    return out


def _torch_all_to_all(
    x: torch.Tensor, sends: list[int], recvs: list[int], comm: AllToAllComm
) -> torch.Tensor:
    import torch.distributed as dist

    x = x.contiguous()
    out = torch.empty((sum(recvs), *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(
        out, x, output_split_sizes=recvs, input_split_sizes=sends, group=comm.group
    )
    return out


def exact_all_to_all(
    x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], comm: AllToAllComm
) -> torch.Tensor:
    """The uncompressed exchange without autograd (the codecs' ``none`` and their baseline)."""
    import time

    sends = _check_splits("send_splits", send_splits, comm)
    recvs = _check_splits("recv_splits", recv_splits, comm)
    if x.dim() == 0 or x.shape[0] != sum(sends):
        raise RuntimeFailure(
            f"all_to_all on rank {comm.rank}: x has shape {tuple(x.shape)} but send_splits "
            f"{sends} add up to {sum(sends)} rows",
            hint="send_splits must partition the first dimension of x",
        )
    start = time.perf_counter()
    if comm.backend == "mpi":
        if x.device.type != "cpu":
            # MPI here is host-only: stage through host memory and go back.
            out = _mpi_all_to_all(x.detach().cpu(), sends, recvs, comm).to(x.device)
        else:
            out = _mpi_all_to_all(x, sends, recvs, comm)
    else:
        out = _torch_all_to_all(x.detach(), sends, recvs, comm)
    comm.stats["seconds"] += time.perf_counter() - start
    sent_rows = sum(sends) - sends[comm.rank]
    comm.stats["bytes_sent"] += float(sent_rows * _row_elems(x) * x.element_size())
    comm.stats["raw_bytes"] = comm.stats.get("raw_bytes", 0.0) + float(sent_rows * _row_elems(x) * x.element_size())
    comm.stats["calls"] += 1
    return out


def _is_exact(codec: str | None) -> bool:
    return codec is None or codec == "none"


def _exchange(
    x: torch.Tensor,
    sends: list[int],
    recvs: list[int],
    comm: AllToAllComm,
    codec: str | None,
    direction: str,
    stream: str | None = None,
) -> torch.Tensor:
    if _is_exact(codec):
        return exact_all_to_all(x, sends, recvs, comm)
    try:
        compressed = importlib.import_module("hetrun.runtime.comms.compressed")
    except ModuleNotFoundError as exc:
        if exc.name != "hetrun.runtime.comms.compressed":
            raise
        raise HetrunError(
            f"all_to_all: codec {codec!r} ({direction}) asks for a compressed all-to-all, but "
            "compressed codecs are unavailable (hetrun.runtime.comms.compressed is not installed)",
            hint="set comms.forward_codec / comms.backward_codec to none in the job YAML",
        ) from exc
    # ``stream`` names the call site (e.g. one MoE layer's dispatch) so error-feedback
    # residuals of different exchanges are kept apart; passed only when given.
    extra = {"stream": stream} if stream is not None else {}
    return compressed.compressed_all_to_all(
        x, sends, recvs, comm, codec=codec, direction=direction, **extra
    )


class _AllToAllFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        sends: list[int],
        recvs: list[int],
        comm: AllToAllComm,
        codec: str | None,
        direction: str,
        backward_codec: str | None,
        stream: str | None,
    ) -> torch.Tensor:
        ctx.sends = sends
        ctx.recvs = recvs
        ctx.comm = comm
        ctx.backward_codec = backward_codec
        ctx.stream = stream
        return _exchange(x, sends, recvs, comm, codec, direction, stream)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        # The gradient of a row lives where the row went; send it home with the splits swapped.
        grad_in = _exchange(
            grad_out.contiguous(), ctx.recvs, ctx.sends, ctx.comm, ctx.backward_codec,
            "backward", ctx.stream,
        )
        return grad_in, None, None, None, None, None, None, None


def all_to_all(
    x: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    comm: AllToAllComm,
    *,
    codec: str | None = None,
    direction: str = "forward",
    backward_codec: str | None = None,
    stream: str | None = None,
) -> torch.Tensor:
    """Expert-parallel all-to-all of the rows of ``x``; differentiable.

    ``send_splits[p]`` rows of ``x`` (in order) go to rank ``p``; the result has
    ``sum(recv_splits)`` rows, ``recv_splits[p]`` of them from rank ``p``, in
    rank order. Both lists have one entry per rank (zeros allowed); get
    ``recv_splits`` from :func:`exchange_splits` when only the sender knows them.

    ``codec`` compresses this exchange (``None``/``"none"``: exact), reported to
    the codec as ``direction``. The backward pass sends the gradient back with
    the splits swapped, compressed with ``backward_codec`` and
    ``direction="backward"`` (``None``: exact). ``stream`` names the call site
    for the codecs' error-feedback state (e.g. ``"moe0.dispatch"``).
    """
    if direction not in _DIRECTIONS:
        raise HetrunError(
            f"all_to_all: direction {direction!r} is not one of {list(_DIRECTIONS)}",
            hint='use direction="forward" or direction="backward"',
        )
    sends = _check_splits("send_splits", send_splits, comm)
    recvs = _check_splits("recv_splits", recv_splits, comm)
    out: torch.Tensor = _AllToAllFunction.apply(
        x, sends, recvs, comm, codec, direction, backward_codec, stream
    )
    return out

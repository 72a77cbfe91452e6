"""The API's collectives over whatever connects the ranks of a user's script.

A torchrun-style script has torch.distributed (gloo or NCCL) and perhaps no
MPI; a script under ``srun --mpi=pmix`` or ``mpirun`` may have MPI and no
process group. Two small pieces cover both:

- a ``Collective`` for the checkpoint store and the restore agreement
  (all-gather of small JSON values, ``hetrun.runtime.ckpt.collective``):
  ``TorchCollective`` over a private gloo group, or the store's
  ``MPICollective``;
- a ``MaxReduce`` transport for the stop agreement: a one-int non-blocking
  MAX all-reduce, polled without blocking.

Each user of a transport gets its own gloo group (created collectively, on
the main thread, in the same order on every rank): the checkpoint writer
all-gathers from its background thread, and messages on a group the
training uses would mismatch with the script's own collectives.
"""

from __future__ import annotations

import json
from typing import Any


def new_cpu_group() -> Any:
    """A gloo group over the whole default world (collective: every rank calls it)."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo")


class TorchCollective:
    """All-gather of JSON values over a gloo group; never pickles."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def allgather(self, value: Any) -> list[Any]:
        import torch
        import torch.distributed as dist

        data = json.dumps(value).encode()
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=self.group)
        width = max(int(s) for s in sizes)
        mine = torch.zeros(width, dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.zeros(width, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(out, mine, group=self.group)
        return [json.loads(bytes(o[: int(n)].numpy())) for o, n in zip(out, sizes, strict=True)]


class TorchMaxReduce:
    """``post(level, stride)`` starts an async MAX all-reduce of two ints on a gloo group."""

    def __init__(self, group: Any) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist, self.group = torch, dist, group
        self._max = dist.ReduceOp.MAX

    def post(self, level: int, stride: int) -> Any:
        buf = self._torch.tensor([level, stride], dtype=self._torch.int32)
        work = self._dist.all_reduce(buf, op=self._max, group=self.group, async_op=True)
        return _TorchPending(work, buf)


class _TorchPending:
    __slots__ = ("buf", "work")

    def __init__(self, work: Any, buf: Any) -> None:
        self.work, self.buf = work, buf

    def done(self) -> bool:
        return bool(self.work.is_completed())

    def wait(self) -> None:
        self.work.wait()

    def value(self) -> tuple[int, int]:
        return int(self.buf[0]), int(self.buf[1])


class MPIMaxReduce:
    """The same over a private duplicate of an mpi4py communicator (Iallreduce)."""

    def __init__(self, comm: Any) -> None:
        from hetrun.runtime import mpi_wait
        from mpi4py import MPI

        self.comm = mpi_wait.dup(comm)
        self._max = MPI.MAX

    def post(self, level: int, stride: int) -> Any:
        import numpy as np

        send, recv = np.array([level, stride], dtype=np.int32), np.zeros(2, dtype=np.int32)
        return _MPIPending(self.comm.Iallreduce(send, recv, op=self._max), send, recv)

    def free(self) -> None:
        """Collective: release the duplicate once every request on it completed."""
        self.comm.Free()


class _MPIPending:
    __slots__ = ("recv", "req", "send")

    def __init__(self, req: Any, send: Any, recv: Any) -> None:
        self.req, self.send, self.recv = req, send, recv  # buffers live until complete

    def done(self) -> bool:
        return bool(self.req.Test())

    def wait(self) -> None:
        from hetrun.runtime import mpi_wait

        mpi_wait.wait_politely(self.req)

    def value(self) -> tuple[int, int]:
        return int(self.recv[0]), int(self.recv[1])

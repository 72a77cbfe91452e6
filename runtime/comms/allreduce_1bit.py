"""1-bit all-reduce (mean) with error feedback, for gradients of replicated parameters.

The shape of DeepSpeed's compressed allreduce (1-bit Adam): each rank adds
its worker residual to the gradient and sends chunk ``j`` of it, 1-bit
encoded, to rank ``j`` (one ``Alltoall``); rank ``j`` decodes the ``P``
versions of its chunk, averages them, adds its server residual, encodes the
average again and everybody gathers every chunk (one ``Allgather``). Both
compressions keep their error for the next step, so over steps the applied
gradient tracks the exact mean. Per rank about ``2 (P-1)/P * n / 28`` bytes
travel instead of ``2 (P-1)/P * 4n``.

Every rank ends with the same result, bit for bit (all decode the same
payloads). The tensors passed are flattened together and updated in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hetrun.kernels.codecs.base import ErrorFeedbackState
from hetrun.kernels.codecs.registry import get_codec
from hetrun.runtime import mpi_wait

from hetrun.errors import RuntimeFailure

__all__ = ["OneBitAllReduce"]


class OneBitAllReduce:
    """``allreduce_mean_(tensors)`` over an mpi4py communicator, 1-bit with error feedback.

    One instance per set of parameters (the residuals belong to it); call it
    with tensors of the same sizes every step.
    """

    def __init__(self, comm: Any, *, block_size: int = 256) -> None:
        self.comm = getattr(comm, "mpi_comm", None) or comm
        if not hasattr(self.comm, "Alltoall"):
            raise RuntimeFailure(
                "OneBitAllReduce needs an mpi4py communicator",
                hint="pass RankContext's mpi4py communicator (or an AllToAllComm.from_mpi)",
            )
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.codec = get_codec("onebit_ef", block_size=block_size)
        self.worker = [ErrorFeedbackState() for _ in range(self.size)]
        self.server = ErrorFeedbackState()
        self.bytes_sent = 0

    def _chunk(self, n: int) -> int:
        b = self.codec.block_size
        per = -(-n // self.size)
        return -(-per // b) * b  # whole blocks, so chunk boundaries never split a block

    def allreduce_mean_(self, tensors: torch.Tensor | Sequence[torch.Tensor]) -> None:
        ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if not ts:
            return
        flat = torch.cat([t.detach().reshape(-1).float().cpu() for t in ts])
        n = flat.numel()
        cs = self._chunk(n)
        padded = torch.zeros(cs * self.size)
        padded[:n] = flat
        wb = self.codec.wire_bytes(cs)
        send = torch.empty(self.size * wb, dtype=torch.uint8)
        for j in range(self.size):
            self.codec.encode_into(
                padded[j * cs : (j + 1) * cs], send[j * wb : (j + 1) * wb], self.worker[j]
            )
        recv = torch.empty_like(send)
        mpi_wait.wait_politely(self.comm.Ialltoall(send.numpy(), recv.numpy()), max_sleep=250e-6)
        # Server side: the mean of my chunk over all ranks, compressed again with feedback.
        mine = torch.zeros(cs)
        part = torch.empty(cs)
        for j in range(self.size):
            self.codec.decode_into(recv[j * wb : (j + 1) * wb], part)
            mine += part
        mine /= self.size
        out_payload = torch.empty(wb, dtype=torch.uint8)
        self.codec.encode_into(mine, out_payload, self.server)
        gathered = np.empty(self.size * wb, dtype=np.uint8)
        mpi_wait.wait_politely(self.comm.Iallgather(out_payload.numpy(), gathered), max_sleep=250e-6)
        g = torch.from_numpy(gathered)
        result = torch.empty(cs * self.size)
        for j in range(self.size):
            self.codec.decode_into(g[j * wb : (j + 1) * wb], result[j * cs : (j + 1) * cs])
        self.bytes_sent += 2 * (self.size - 1) * wb
        pos = 0
        for t in ts:
            k = t.numel()
            t.copy_(result[pos : pos + k].reshape(t.shape).to(t.dtype))
            pos += k

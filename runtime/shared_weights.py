"""Node-local weight sharing: ranks on one node read ONE copy of a tensor dict.

CPU: an MPI shared-memory window (``MPI.Win.Allocate_shared`` on the node
communicator). The node's root rank allocates it; every rank maps the same
pages and gets torch tensors that *view* them (numpy ``frombuffer`` ->
``torch.from_numpy``), so N ranks cost one copy of resident memory.

A small header in front of the tensors holds a sequence counter and the
published version (a seqlock): the writer makes the counter odd while it
writes and even when done; ``read_consistent`` copies only a stable snapshot.
Ranks that use the views directly (no copy) must not run while the root
writes — call ``publish`` at a point all readers agree on (e.g. between
iterations, after a node barrier).

GPU: CUDA IPC handles / an intra-node broadcast cannot be exercised on this
machine (no GPU); ``SharedWeights.create`` raises a clear error for CUDA
tensors instead of silently copying. The CPU path is the fallback: stage the
weights in host shared memory and let each rank copy to its device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hetrun.runtime import mpi_wait

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import RuntimeFailure

_RETRY = Backoff(first=0.0005, most=0.0005, factor=1)  # a writer holds the seqlock for one copy
_HEADER = 64  # bytes: [seq int64, version int64, ...], keeps tensors 64-byte aligned
_ALIGN = 64


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class _Slot:
    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class SharedWeights:
    """One copy per node of a fixed-layout tensor dict, viewable by every rank of the node."""

    def __init__(self, node_comm: Any, win: Any, buf: np.ndarray, slots: list[_Slot]) -> None:
        self.comm = node_comm
        self.win = win
        self._buf = buf
        self.slots = slots
        self._hdr = np.frombuffer(buf, dtype=np.int64, count=2, offset=0)
        self.tensors: dict[str, torch.Tensor] = {}
        body = torch.from_numpy(buf)
        for s in slots:
            dt = getattr(torch, s.dtype)
            raw = body[s.offset : s.offset + s.nbytes]
            self.tensors[s.key] = raw.view(dt).reshape(s.shape) if s.nbytes else torch.empty(
                s.shape, dtype=dt)

    @property
    def is_root(self) -> bool:
        return int(self.comm.Get_rank()) == 0

    @property
    def nbytes(self) -> int:
        return int(self._buf.size)

    @classmethod
    def create(cls, node_comm: Any, template: dict[str, torch.Tensor] | None) -> SharedWeights:
        """Collective over ``node_comm``; the node root passes the template (layout + values)."""
        from mpi4py import MPI

        layout: str | None = None
        if node_comm.Get_rank() == 0:
            if template is None:
                raise RuntimeFailure("SharedWeights.create: the node root must pass the tensors")
            slots_out: list[tuple[str, str, list[int], int, int]] = []
            offset = _HEADER
            for key, t in template.items():
                if t.device.type != "cpu":
                    raise RuntimeFailure(
                        f"shared weights for {t.device.type} tensor {key!r}: CUDA IPC sharing is "
                        "not supported in this build",
                        hint="pass CPU tensors (host shared memory) and copy to the device per rank",
                    )
                nbytes = t.numel() * t.element_size()
                slots_out.append((key, str(t.dtype).removeprefix("torch."), list(t.shape), offset,
                                  nbytes))
                offset += _align(nbytes)
            layout = json.dumps({"slots": slots_out, "total": offset})
        layout = mpi_wait.bcast(node_comm, layout, root=0)
        info = json.loads(layout)
        total = int(info["total"])
        size = total if node_comm.Get_rank() == 0 else 0
        win = MPI.Win.Allocate_shared(size, 1, comm=node_comm)
        mem, _ = win.Shared_query(0)
        buf = np.frombuffer(mem, dtype=np.uint8, count=total)  # type: ignore[call-overload]
        slots = [_Slot(k, d, tuple(s), o, n) for k, d, s, o, n in info["slots"]]
        shared = cls(node_comm, win, buf, slots)
        if shared.is_root:
            assert template is not None
            # Window memory is not zeroed everywhere (COMM_SELF: plain malloc): an odd
            # garbage sequence number would make every read wait for a writer forever.
            shared._hdr[:] = 0
            shared._write(template, version=0)
        mpi_wait.meet(node_comm)
        return shared

    # ------------------------------------------------------------- writing
    def _write(self, state: dict[str, torch.Tensor], version: int) -> None:
        self._hdr[0] += 1  # odd: writing
        with torch.no_grad():
            for s in self.slots:
                src = state[s.key]
                if tuple(src.shape) != s.shape:
                    raise RuntimeFailure(
                        f"shared weights: {s.key!r} has shape {tuple(src.shape)}, the shared "
                        f"layout has {s.shape}")
                self.tensors[s.key].copy_(src)
        self._hdr[1] = version
        self._hdr[0] += 1  # even: stable

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Root only: overwrite the node's copy and publish ``version``."""
        if not self.is_root:
            raise RuntimeFailure("SharedWeights.publish is for the node root rank only")
        self._write(state, version)

    # ------------------------------------------------------------- reading
    @property
    def version(self) -> int:
        return int(self._hdr[1])

    def read_consistent(self, timeout_s: float = 10.0) -> tuple[int, dict[str, torch.Tensor]]:
        """A private copy of a stable snapshot (retries while the root writes)."""
        got = poll_until(self._try_snapshot, _RETRY, timeout=timeout_s)
        if got is None:
            raise RuntimeFailure(f"shared weights: no stable snapshot within {timeout_s}s")
        return got

    def _try_snapshot(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """A copy taken while no write was under way (seqlock: even and unchanged), else None."""
        seq = int(self._hdr[0])
        if seq % 2:
            return None
        version = int(self._hdr[1])
        copy = {k: v.clone() for k, v in self.tensors.items()}
        return (version, copy) if int(self._hdr[0]) == seq else None

    def free(self) -> None:
        self.tensors.clear()
        self._hdr = None  # type: ignore[assignment]
        self._buf = None  # type: ignore[assignment]
        if self.win is not None:
            self.win.Free()
            self.win = None

"""Point-to-point messages of tensor dicts over mpi4py, without pickle.

A message is one contiguous byte buffer: an 8-byte header length, a JSON
header (message kind, producer action, iteration, and per tensor: key, dtype,
shape, offset) and the raw tensor bytes. The receiver probes for the size,
receives into a fresh buffer and rebuilds tensors that view it. Nothing is
unpickled on either side, and the byte count recorded in events is exact.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hetrun.runtime.tensor_dtypes import TORCH_DTYPES

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import RuntimeFailure

TAG = 4242  # one tag: the header routes the message; MPI keeps per-source FIFO order

# Shared with the checkpoint state (runtime/tensor_dtypes.py). The framing stays hand-made:
# safetensors' save/load through its library was 1.4-4x slower per message (benchmarks/runtime.md).
_DTYPES = TORCH_DTYPES


@dataclass
class Message:
    kind: str  # "data" | "state" | "token"
    producer: str  # action id
    iteration: int
    source: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    nbytes: int


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


def pack(kind: str, producer: str, iteration: int, tensors: dict[str, torch.Tensor],
         meta: dict[str, Any] | None = None) -> np.ndarray:
    """One uint8 buffer holding header + tensor bytes."""
    entries: list[dict[str, Any]] = []
    offset = 0
    flats = []
    for key, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise RuntimeFailure(
                f"batch/state key {key!r} of {producer!r} is a {type(t).__name__}, not a tensor",
                hint="return a dict of torch tensors (put scalars in 0-d tensors)",
            )
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise RuntimeFailure(f"tensor {key!r} of {producer!r} has unsupported dtype {name}")
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        entries.append({"k": key, "d": name, "s": list(t.shape), "o": offset, "n": raw.numel()})
        flats.append(raw)
        offset += _align(raw.numel())
    header = json.dumps(
        {"kind": kind, "producer": producer, "it": iteration, "t": entries, "meta": meta or {}},
        separators=(",", ":"),
    ).encode()
    # Body starts (and every tensor starts) 64-byte aligned so the receiver's
    # tensors can view the buffer whatever their dtype.
    hlen = _align(8 + len(header)) - 8
    header = header.ljust(hlen)
    buf = np.empty(8 + hlen + offset, dtype=np.uint8)
    buf[:8] = np.frombuffer(struct.pack("<Q", hlen), dtype=np.uint8)
    buf[8 : 8 + hlen] = np.frombuffer(header, dtype=np.uint8)
    body = torch.from_numpy(buf[8 + hlen :])
    for entry, raw in zip(entries, flats, strict=True):
        body[entry["o"] : entry["o"] + entry["n"]].copy_(raw)
    return buf


def unpack(buf: np.ndarray, source: int) -> Message:
    (hlen,) = struct.unpack("<Q", buf[:8].tobytes())
    header = json.loads(buf[8 : 8 + hlen].tobytes())
    body = torch.from_numpy(buf[8 + hlen :])
    tensors = {}
    for e in header["t"]:
        dtype = _DTYPES[e["d"]]
        raw = body[e["o"] : e["o"] + e["n"]]
        tensors[e["k"]] = raw.view(dtype).reshape(e["s"]) if e["n"] else torch.empty(
            e["s"], dtype=dtype)
    return Message(
        kind=header["kind"], producer=header["producer"], iteration=int(header["it"]),
        source=source, tensors=tensors, meta=header.get("meta", {}), nbytes=int(buf.size),
    )


class Mailbox:
    """Non-blocking sends (kept alive until complete) and polling receives on one comm.

    Counts of messages sent to / received from each peer are kept so the end
    of a run (or a preemption stop) can drain exactly the messages in flight.
    """

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.size = comm.Get_size()
        self.pending: list[tuple[Any, np.ndarray]] = []
        self.sent = [0] * self.size
        self.received = [0] * self.size
        self.bytes_sent = 0
        self.bytes_received = 0

    def isend(self, buf: np.ndarray, dest: int) -> int:
        req = self.comm.Isend([buf, self._mpi.BYTE], dest=dest, tag=TAG)
        self.pending.append((req, buf))
        self.sent[dest] += 1
        self.bytes_sent += buf.size
        self._reap()
        return int(buf.size)

    def _reap(self) -> None:
        if self.pending:
            self.pending = [(r, b) for r, b in self.pending if not r.Test()]

    def poll(self) -> Message | None:
        """Receive one message if one has arrived, else None."""
        self._reap()
        status = self._mpi.Status()
        if not self.comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=TAG, status=status):
            return None
        return self._recv(status.Get_source(), status.Get_count(self._mpi.BYTE))

    def _recv(self, source: int, count: int) -> Message:
        raw = np.empty(count + 64, dtype=np.uint8)
        start = -raw.ctypes.data % 64
        buf = raw[start : start + count]
        self.comm.Recv([buf, self._mpi.BYTE], source=source, tag=TAG)
        self.received[source] += 1
        self.bytes_received += count
        return unpack(buf, source)

    def recv_from(self, source: int) -> Message:
        status = self._mpi.Status()
        # Not MPI_Probe: a blocking probe busy-polls a core the sender may need.
        poll_until(lambda: self.comm.Iprobe(source=source, tag=TAG, status=status),
                   Backoff(first=10e-6, most=1e-3))
        return self._recv(source, status.Get_count(self._mpi.BYTE))

    def drain(self, on_message: Callable[[Message], None] | None = None) -> int:
        """Collective: receive every message still in flight to this rank.

        Each is handed to ``on_message`` (control messages matter; late data
        is dropped by it). Returns how many arrived. After it, every send has
        completed, so MPI_Finalize cannot block on an unmatched message.
        """
        expected = self.comm.alltoall(self.sent)
        dropped = 0
        for source, count in enumerate(expected):
            while self.received[source] < count:
                msg = self.recv_from(source)
                if on_message is not None:
                    on_message(msg)
                dropped += 1
        for req, _ in self.pending:
            req.Wait()
        self.pending.clear()
        return dropped

"""Adaptive compression: measure each link and compress only where it pays.

On shared memory a compressed exchange is ~4x slower than a plain copy; on a
1 Gbit/s link it is several times faster. The decision is per (source,
destination) pair, from two measurements taken with all ranks busy at once,
as they are during an all-to-all:

- the link bandwidth of every pair (timed ``Sendrecv`` rounds over MPI);
- the codec's encode and decode throughput on this rank.

A chunk of ``n`` raw bytes costs ``n / bw`` exact, and at most
``n / enc + n / (ratio * bw) + n / dec`` compressed (no overlap assumed, so
the decision errs towards exact). Compression pays while
``bw < (1 - 1 / ratio) / (1 / enc + 1 / dec)`` -- the break-even link speed.
The resulting matrix is allgathered so every rank holds the same one
(sender and receiver must agree on a chunk's format).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from hetrun.dag.errors import HetrunError
from hetrun.kernels.codec import Codec
from hetrun.kernels.codec_registry import get_codec

from .compressed import PairPolicy, exchange_for

__all__ = [
    "AdaptiveCompression",
    "CodecSpeed",
    "break_even_bandwidth",
    "calibrate",
    "codec_speed",
    "measure_pair_bandwidth",
]


@dataclass(frozen=True)
class CodecSpeed:
    """Raw (fp32) bytes per second through encode and decode, and the size ratio."""

    encode_bps: float
    decode_bps: float
    ratio: float


def codec_speed(codec: Codec, numel: int = 1 << 22, reps: int = 3) -> CodecSpeed:
    """Best-of-``reps`` encode/decode throughput of ``codec`` on this rank (CPU tensors)."""
    x = torch.randn(numel)
    payload = torch.empty(codec.wire_bytes(numel), dtype=torch.uint8)
    out = torch.empty(numel)
    state = codec.new_state() if codec.stateful else None
    enc = dec = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        codec.encode_into(x, payload, state)
        t1 = time.perf_counter()
        codec.decode_into(payload, out)
        t2 = time.perf_counter()
        enc, dec = min(enc, t1 - t0), min(dec, t2 - t1)
    nbytes = numel * 4
    return CodecSpeed(nbytes / enc, nbytes / dec, codec.ratio(numel))


def break_even_bandwidth(speed: CodecSpeed) -> float:
    """Link bytes/s above which compression stops paying (no encode/send/decode overlap)."""
    return (1.0 - 1.0 / speed.ratio) / (1.0 / speed.encode_bps + 1.0 / speed.decode_bps)


def _mpi_comm(comm: Any) -> Any:
    mpi = getattr(comm, "mpi_comm", None)
    if mpi is None and hasattr(comm, "Sendrecv"):
        mpi = comm
    if mpi is None:
        raise HetrunError(
            "adaptive compression measures links over MPI, but this all-to-all runs over "
            "torch.distributed",
            hint="build the AllToAllComm with from_mpi, or set the pair policy yourself "
            "(exchange_for(comm).policy = PairPolicy(...))",
        )
    return mpi


def measure_pair_bandwidth(comm: Any, nbytes: int = 8 << 20, reps: int = 2) -> list[list[float]]:
    """``bw[src][dst]`` in bytes/s for every pair, measured with all ranks sending at once.

    Round ``k`` sends to ``rank + k`` and receives from ``rank - k``, so every
    link of the all-to-all pattern is loaded as in the real exchange. Collective.
    """
    import numpy as np

    mpi = _mpi_comm(comm)
    rank, size = mpi.Get_rank(), mpi.Get_size()
    sbuf = np.ones(nbytes, dtype=np.uint8)
    rbuf = np.empty(nbytes, dtype=np.uint8)
    row = [float("inf")] * size
    for k in range(1, size):
        dst, src = (rank + k) % size, (rank - k) % size
        best = float("inf")
        for _ in range(reps):
            mpi.Barrier()
            t0 = time.perf_counter()
            mpi.Sendrecv(sbuf, dest=dst, sendtag=k, recvbuf=rbuf, source=src, recvtag=k)
            best = min(best, time.perf_counter() - t0)
        row[dst] = nbytes / best
    return [list(r) for r in mpi.allgather(row)]


def calibrate(
    comm: Any,
    codec: str | Codec = "onebit",
    *,
    nbytes: int = 8 << 20,
    codec_numel: int = 1 << 22,
) -> PairPolicy:
    """Measure links and codec speed, install the resulting pair policy on ``comm``. Collective.

    The codec speed used is the slowest rank's (all ranks measure at the same
    time, so CPU sharing between ranks of a node is included).
    """
    mpi = _mpi_comm(comm)
    cod = codec if isinstance(codec, Codec) else get_codec(codec, key_path="comms")
    bw = measure_pair_bandwidth(comm, nbytes)
    mpi.Barrier()
    mine = codec_speed(cod, codec_numel)
    speeds = mpi.allgather((mine.encode_bps, mine.decode_bps))
    speed = CodecSpeed(min(s[0] for s in speeds), min(s[1] for s in speeds), mine.ratio)
    limit = break_even_bandwidth(speed)
    size = len(bw)
    matrix = [[s != d and bw[s][d] < limit for d in range(size)] for s in range(size)]
    off = sum(1 for s in range(size) for d in range(size) if s != d and not matrix[s][d])
    policy = PairPolicy(
        matrix,
        reason=f"break-even {limit * 8 / 1e9:.1f} Gbit/s for {cod.name}; "
        f"{off} of {size * (size - 1)} pairs faster, sent raw",
    )
    policy.bandwidth = bw  # type: ignore[attr-defined]
    policy.speed = speed  # type: ignore[attr-defined]
    policy.break_even_bps = limit  # type: ignore[attr-defined]
    exchange_for(comm).policy = policy
    return policy


class AdaptiveCompression:
    """Calibrate at start-up and again when the all-to-all speed drifts.

    Call :meth:`step` on every rank at the same point (a step boundary). It
    compares the all-to-all seconds per call over the last ``window`` steps
    with the window after the last calibration; when any rank sees a change
    beyond ``drift`` (e.g. 0.5 = +-50%), all ranks re-measure together.
    """

    def __init__(
        self, comm: Any, codec: str | Codec = "onebit", *, window: int = 20, drift: float = 0.5
    ) -> None:
        self.comm = comm
        self.codec = codec
        self.window = window
        self.drift = drift
        self.policy = calibrate(comm, codec)
        self.recalibrations = 0
        self._baseline: float | None = None
        self._mark = (comm.stats["seconds"], comm.stats["calls"])
        self._steps = 0

    def step(self) -> bool:
        """Returns True when this step re-calibrated. Collective."""
        self._steps += 1
        if self._steps % self.window:
            return False
        secs, calls = self.comm.stats["seconds"], self.comm.stats["calls"]
        d_calls = calls - self._mark[1]
        per_call = (secs - self._mark[0]) / d_calls if d_calls else 0.0
        self._mark = (secs, calls)
        moved = False
        if self._baseline is None:
            self._baseline = per_call if per_call > 0 else None
        elif per_call > 0:
            moved = abs(per_call / self._baseline - 1.0) > self.drift
        from mpi4py import MPI

        # Every rank reaches this allreduce at the same step, whatever it saw.
        if not _mpi_comm(self.comm).allreduce(moved, op=MPI.LOR):
            return False
        self.policy = calibrate(self.comm, self.codec)
        self.recalibrations += 1
        self._baseline = None
        return True

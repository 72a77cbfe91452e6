"""Adaptive compression: measure each link and compress only where it pays.

On shared memory a compressed exchange is ~4x slower than a plain copy; on a
1 Gbit/s link it is several times faster. The decision is per (source,
destination) pair, from timings taken with all ranks busy at once, as they
are during an all-to-all: each round every rank sends a buffer to one peer
raw, then encoded + sent + decoded (:func:`measure_pair_times`). A pair
compresses when that is faster by a margin. Timing the real thing, rather
than predicting it from codec throughput, catches what a model misses: the
CPU that the transport itself burns on shared memory and loopback, and the
CPU co-located ranks take from each other's codecs.

The pairwise timing misses what comes with a whole exchange (the rank's own
chunk copied, per-piece Python and MPI overhead, every peer at once), and on
shared memory it once kept compression on while the real 64 MB exchange ran
0.8x. So :func:`calibrate` then times whole exchanges, exact vs compressed
with the pairwise policy (:func:`measure_exchange_times`), and keeps
compression only if that is faster by the margin too; and
:class:`AdaptiveCompression` repeats that check at the size the real exchanges
turned out to have, after its first window, switching compression off where
it does not pay.

Reported alongside: the break-even link speed, from the no-overlap model
``n / bw = t_cpu + n / (ratio * bw)``, i.e. compression pays while
``bw < n (1 - 1/ratio) / t_cpu`` (:func:`break_even_bandwidth` does the same
from codec throughput alone). Every rank holds the same allgathered matrix,
so sender and receiver always agree on a chunk's format.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from hetrun.kernels.codecs.base import Codec
from hetrun.kernels.codecs.registry import get_codec

from hetrun.errors import HetrunError

from .compressed import PairPolicy, exchange_for

__all__ = [
    "AdaptiveCompression",
    "CodecSpeed",
    "break_even_bandwidth",
    "calibrate",
    "codec_speed",
    "measure_exchange_times",
    "measure_pair_bandwidth",
]

#: Row width (fp32 values) of the whole-exchange check: a MoE hidden size.
EXCHANGE_WIDTH = 256


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


def measure_pair_times(
    comm: Any, codec: Codec, nbytes: int = 8 << 20, reps: int = 2
) -> tuple[list[list[float]], list[list[float]]]:
    """Seconds per pair for ``nbytes`` of fp32 sent raw, and encoded + sent + decoded.

    Both timed in the same rounds as :func:`measure_pair_bandwidth`, all
    ranks at once, into warm buffers: the compressed time includes the CPU
    the codec really gets next to its co-located peers. Collective.
    """
    mpi = _mpi_comm(comm)
    rank, size = mpi.Get_rank(), mpi.Get_size()
    numel = nbytes // 4
    x = torch.randn(numel)
    y = torch.empty(numel)
    y.fill_(0)
    wb = codec.wire_bytes(numel)
    pay = torch.zeros(wb, dtype=torch.uint8)
    pin = torch.zeros(wb, dtype=torch.uint8)
    xb, yb = x.view(torch.uint8).numpy(), y.view(torch.uint8).numpy()
    raw_row = [0.0] * size
    comp_row = [0.0] * size
    state = codec.new_state() if codec.stateful else None
    for k in range(1, size):
        dst, src = (rank + k) % size, (rank - k) % size
        raw = comp = float("inf")
        for _ in range(reps):
            mpi.Barrier()
            t0 = time.perf_counter()
            mpi.Sendrecv(xb, dest=dst, sendtag=k, recvbuf=yb, source=src, recvtag=k)
            raw = min(raw, time.perf_counter() - t0)
            mpi.Barrier()
            t0 = time.perf_counter()
            codec.encode_into(x, pay, state)
            mpi.Sendrecv(pay.numpy(), dest=dst, sendtag=k, recvbuf=pin.numpy(), source=src, recvtag=k)
            codec.decode_into(pin, y)
            comp = min(comp, time.perf_counter() - t0)
        raw_row[dst], comp_row[dst] = raw, comp
    return [list(r) for r in mpi.allgather(raw_row)], [list(r) for r in mpi.allgather(comp_row)]


def measure_exchange_times(
    comm: Any, codec: Codec, nbytes_per_peer: int, *, reps: int = 3
) -> tuple[float, float]:
    """Seconds of one whole exchange, exact and compressed (with the policy installed on
    ``comm``), of ``nbytes_per_peer`` fp32 bytes to every peer: the slowest rank's time,
    median over ``reps`` interleaved rounds. Both go through the functions the MoE
    layer calls (fresh results), so the own-chunk copy and per-piece overhead count.
    Leaves ``comm.stats`` as it found them. Collective.
    """
    import statistics

    from mpi4py import MPI

    from .alltoall import exact_all_to_all
    from .compressed import compressed_all_to_all

    mpi = _mpi_comm(comm)
    size = mpi.Get_size()
    rows = max(1, nbytes_per_peer // (4 * EXCHANGE_WIDTH))
    splits = [rows] * size
    x = torch.randn(rows * size, EXCHANGE_WIDTH)
    saved = dict(comm.stats)
    exact: list[float] = []
    comp: list[float] = []
    try:
        for _ in range(reps):
            for timings, run in (
                (exact, lambda: exact_all_to_all(x, splits, splits, comm)),
                (comp, lambda: compressed_all_to_all(
                    x, splits, splits, comm, codec=codec, stream="_calibrate")),
            ):
                mpi.Barrier()
                t0 = time.perf_counter()
                run()
                timings.append(mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    finally:
        comm.stats.clear()
        comm.stats.update(saved)
    return statistics.median(exact), statistics.median(comp)


def _all_raw(size: int, reason: str) -> PairPolicy:
    return PairPolicy([[False] * size for _ in range(size)], reason=reason)


def calibrate(
    comm: Any,
    codec: str | Codec = "onebit",
    *,
    nbytes: int = 8 << 20,
    margin: float = 0.1,
    exchange_bytes: int | None = None,
) -> PairPolicy:
    """Time every pair raw and compressed; compress where it is faster by ``margin``, then
    confirm on whole exchanges (``exchange_bytes`` per peer, default ``nbytes``) that the
    policy beats the exact exchange by ``margin`` too, else send everything raw. Collective.

    Installs the policy on ``comm`` (every rank computes the same matrix from
    the allgathered timings) and returns it, with ``bandwidth`` (bytes/s per
    pair), ``raw_s`` / ``compressed_s`` (seconds per pair), ``exchange_s``
    (exact, compressed seconds of the whole-exchange check; None when no pair
    compressed) and ``break_even_bps``: the link speed at which this codec
    stops paying here, from the CPU time the compressed exchanges took (median
    over pairs).
    """
    import statistics

    cod = codec if isinstance(codec, Codec) else get_codec(codec, key_path="comms")
    raw, comp = measure_pair_times(comm, cod, nbytes)
    size = len(raw)
    pairs = [(s, d) for s in range(size) for d in range(size) if s != d]
    matrix = [[False] * size for _ in range(size)]
    for s, d in pairs:
        matrix[s][d] = comp[s][d] < raw[s][d] * (1.0 - margin)
    bw = [[nbytes / raw[s][d] if s != d else float("inf") for d in range(size)] for s in range(size)]
    ratio = cod.ratio(nbytes // 4)
    wire = nbytes / ratio
    # t_comp = t_cpu + wire / bw, so compression pays while bw < nbytes (1 - 1/ratio) / t_cpu.
    limits = [
        nbytes * (1.0 - 1.0 / ratio) / max(comp[s][d] - wire / bw[s][d], 1e-9) for s, d in pairs
    ]
    limit = statistics.median(limits) if limits else float("inf")
    off = sum(1 for s, d in pairs if not matrix[s][d])
    policy = PairPolicy(
        matrix,
        reason=f"{cod.name} pays below ~{limit * 8 / 1e9:.1f} Gbit/s here; "
        f"{off} of {len(pairs)} pairs faster raw, sent raw",
    )
    exchange_for(comm).policy = policy
    exchange_s = None
    if off < len(pairs):
        exchange_s = measure_exchange_times(comm, cod, exchange_bytes or nbytes)
        if exchange_s[1] > exchange_s[0] * (1.0 - margin):
            policy = _all_raw(size, _whole_exchange_reason(cod, exchange_s, margin, policy.reason))
            exchange_for(comm).policy = policy
    policy.bandwidth = bw  # type: ignore[attr-defined]
    policy.raw_s = raw  # type: ignore[attr-defined]
    policy.compressed_s = comp  # type: ignore[attr-defined]
    policy.break_even_bps = limit  # type: ignore[attr-defined]
    policy.exchange_s = exchange_s  # type: ignore[attr-defined]
    return policy


def _whole_exchange_reason(
    cod: Codec, exchange_s: tuple[float, float], margin: float, before: str
) -> str:
    return (
        f"{before}; but a whole exchange took {exchange_s[1] * 1e3:.1f} ms compressed vs "
        f"{exchange_s[0] * 1e3:.1f} ms exact (needs {margin:.0%} faster): all pairs sent raw "
        f"({cod.name})"
    )


class AdaptiveCompression:
    """Calibrate at start-up, check the decision on the real exchanges, and calibrate
    again when the all-to-all speed drifts.

    Call :meth:`step` on every rank at the same point (a step boundary). At the
    end of the first ``window`` steps after a calibration that left compression
    on, it times whole exchanges again at the size the real ones had (mean
    fp32 bytes per call and peer) and switches compression off when it is not
    ``margin`` faster there. After that it compares the all-to-all seconds per
    call over the last ``window`` steps with the first window; when any rank
    sees a change beyond ``drift`` (e.g. 0.5 = +-50%), all ranks re-measure together.
    """

    def __init__(
        self,
        comm: Any,
        codec: str | Codec = "onebit",
        *,
        window: int = 20,
        drift: float = 0.5,
        margin: float = 0.1,
        nbytes: int = 8 << 20,
    ) -> None:
        self.comm = comm
        self.codec = codec
        self.window = window
        self.drift = drift
        self.margin = margin
        self.nbytes = nbytes
        self.policy = calibrate(comm, codec, nbytes=nbytes, margin=margin)
        self.recalibrations = 0
        self.rechecks = 0
        self._checked = False
        self._baseline: float | None = None
        self._mark = (comm.stats["seconds"], comm.stats["calls"], comm.stats.get("raw_bytes", 0.0))
        self._steps = 0

    def _compressing(self) -> bool:
        return any(any(row) for row in self.policy.compress)

    def _recheck(self, raw_per_call: float) -> None:
        """Whole exchanges at the real size, under the current policy; off if they do not pay."""
        from mpi4py import MPI

        size = _mpi_comm(self.comm).Get_size()
        # the same size on every rank (the mean), so the check itself is collective-safe
        mean = _mpi_comm(self.comm).allreduce(raw_per_call, op=MPI.SUM) / size
        per_peer = int(mean / max(1, size - 1))
        self.rechecks += 1
        if per_peer < 4 * EXCHANGE_WIDTH:
            return
        cod = self.codec if isinstance(self.codec, Codec) else get_codec(self.codec, key_path="comms")
        exchange_s = measure_exchange_times(self.comm, cod, per_peer)
        if exchange_s[1] > exchange_s[0] * (1.0 - self.margin):
            policy = _all_raw(size, _whole_exchange_reason(cod, exchange_s, self.margin, self.policy.reason))
            policy.exchange_s = exchange_s  # type: ignore[attr-defined]
            exchange_for(self.comm).policy = policy
            self.policy = policy

    def step(self) -> bool:
        """Returns True when this step re-calibrated. Collective."""
        self._steps += 1
        if self._steps % self.window:
            return False
        secs, calls = self.comm.stats["seconds"], self.comm.stats["calls"]
        raw = self.comm.stats.get("raw_bytes", 0.0)
        d_calls = calls - self._mark[1]
        per_call = (secs - self._mark[0]) / d_calls if d_calls else 0.0
        raw_per_call = (raw - self._mark[2]) / d_calls if d_calls else 0.0
        if not self._checked:
            self._checked = True
            if self._compressing():
                self._recheck(raw_per_call)
                # the baseline for drift is taken under the policy now in force
                self._mark = (self.comm.stats["seconds"], self.comm.stats["calls"],
                              self.comm.stats.get("raw_bytes", 0.0))
                return False
        self._mark = (secs, calls, raw)
        moved = False
        if self._baseline is None:
            self._baseline = per_call if per_call > 0 else None
        elif per_call > 0:
            moved = abs(per_call / self._baseline - 1.0) > self.drift
        from mpi4py import MPI

        # Every rank reaches this allreduce at the same step, whatever it saw.
        if not _mpi_comm(self.comm).allreduce(moved, op=MPI.LOR):
            return False
        self.policy = calibrate(self.comm, self.codec, nbytes=self.nbytes, margin=self.margin)
        self.recalibrations += 1
        self._baseline = None
        self._checked = False
        return True

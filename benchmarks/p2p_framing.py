"""Tensor message framing: hetrun's p2p framing against safetensors, side by side in one run.

    python benchmarks/p2p_framing.py                      # in-process: pack -> receive copy -> unpack
    mpirun -n 2 python benchmarks/p2p_framing.py --mpi    # real ranks: ping-pong over Open MPI

What one message costs the two ranks, for a state of 1 KB, 1 MB and 64 MB
(a float32 tensor with a bfloat16 and an int64 neighbour, the mix a rollout
batch has):

- ``hetrun``: ``runtime.comms.p2p.pack`` (one copy into a 64-byte aligned
  buffer with a JSON header) and ``unpack`` (tensors that view the received
  buffer: no copy);
- ``safetensors``: ``safetensors.torch.save(tensors, metadata=...)`` (the
  message fields in its ``__metadata__``) and ``safetensors.torch.load`` on the
  received bytes. ``load`` accepts only ``bytes``, so the receive buffer is
  turned into ``bytes`` first (a copy); ``load`` copies into new tensors.

In-process mode stands in for the wire with one ``np.copyto`` into a fresh
buffer, which is what ``Mailbox._recv`` receives into; the MPI mode sends for
real (rank 0 -> rank 1 -> rank 0, time / 2 per one-way message). Every received
state is checked equal to the sent one. Prints one JSON line per (size,
framing) with the median of ``--reps`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import safetensors.torch as st
import torch
from hetrun.runtime.comms.p2p import pack, unpack

SIZES = {"1KB": 1 << 10, "1MB": 1 << 20, "64MB": 64 << 20}


def state_of(nbytes: int) -> dict[str, torch.Tensor]:
    """~``nbytes``: 7/8 float32 weights, 1/8 bfloat16, plus a small int64 index."""
    g = torch.Generator().manual_seed(nbytes)
    n32 = max(1, nbytes * 7 // 8 // 4)
    n16 = max(1, nbytes // 8 // 2)
    return {
        "obs": torch.randn(n32, generator=g),
        "logp": torch.randn(n16, generator=g).to(torch.bfloat16),
        "index": torch.arange(8, dtype=torch.int64),
    }


def st_pack(kind: str, producer: str, iteration: int, tensors: dict[str, torch.Tensor],
            meta: dict[str, Any]) -> np.ndarray:
    fields = json.dumps({"kind": kind, "producer": producer, "it": iteration, "meta": meta})
    data = st.save({k: t.detach().cpu().contiguous() for k, t in tensors.items()},
                   metadata={"hetrun": fields})
    return np.frombuffer(data, dtype=np.uint8)


def st_unpack(buf: np.ndarray) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    data = buf.tobytes()  # load() takes bytes only
    (hlen,) = np.frombuffer(data[:8], dtype="<u8")
    fields = json.loads(json.loads(data[8 : 8 + int(hlen)])["__metadata__"]["hetrun"])
    return fields, st.load(data)


FRAMINGS: dict[str, tuple[Callable[..., np.ndarray], Callable[[np.ndarray], dict[str, torch.Tensor]]]] = {
    "hetrun": (pack, lambda buf: unpack(buf, 0).tensors),
    "safetensors": (st_pack, lambda buf: st_unpack(buf)[1]),
}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "state changed in transit"


def _received(buf: np.ndarray) -> np.ndarray:
    """What Mailbox._recv does: a fresh 64-byte aligned buffer the bytes land in."""
    raw = np.empty(buf.size + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start : start + buf.size]
    np.copyto(out, buf)
    return out


def in_process(reps: int) -> None:
    for label, nbytes in SIZES.items():
        state = state_of(nbytes)
        times: dict[str, list[float]] = {name: [] for name in FRAMINGS}
        wire: dict[str, int] = {}
        for _ in range(reps):
            for name, (pk, up) in FRAMINGS.items():  # interleaved: both see the same load
                t0 = time.perf_counter()
                buf = pk("data", "rollout", 3, state, {"step": 3})
                got = up(_received(buf))
                times[name].append(time.perf_counter() - t0)
                wire[name] = int(buf.size)
                _same(state, got)
        for name, ts in times.items():
            print(json.dumps({"mode": "in-process", "size": label, "framing": name, "wire_bytes": wire[name],
                              "median_ms": round(statistics.median(ts) * 1e3, 4)}))


def over_mpi(reps: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert comm.Get_size() == 2, "run with mpirun -n 2"
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()

    def one_way(pk: Callable[..., np.ndarray], up: Callable[[np.ndarray], Any], state: Any) -> None:
        if rank == 0:
            buf = pk("data", "rollout", 3, state, {"step": 3})
            comm.Send([buf, MPI.BYTE], dest=peer, tag=7)
        else:
            status = MPI.Status()
            comm.Probe(source=peer, tag=7, status=status)
            raw = np.empty(status.Get_count(MPI.BYTE) + 64, dtype=np.uint8)
            start = -raw.ctypes.data % 64
            recv = raw[start : start + status.Get_count(MPI.BYTE)]
            comm.Recv([recv, MPI.BYTE], source=peer, tag=7)
            _same(state, up(recv))

    for label, nbytes in SIZES.items():
        state = state_of(nbytes)
        times: dict[str, list[float]] = {name: [] for name in FRAMINGS}
        for _ in range(reps):
            for name, (pk, up) in FRAMINGS.items():
                comm.Barrier()
                t0 = time.perf_counter()
                one_way(pk, up, state)
                comm.Barrier()
                times[name].append(time.perf_counter() - t0)
        if rank == 0:
            for name, ts in times.items():
                print(json.dumps({"mode": "mpi 2 ranks", "size": label, "framing": name,
                                  "median_ms": round(statistics.median(ts) * 1e3, 4)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mpi", action="store_true", help="real ranks (mpirun -n 2)")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    (over_mpi if args.mpi else in_process)(args.reps)


if __name__ == "__main__":
    main()

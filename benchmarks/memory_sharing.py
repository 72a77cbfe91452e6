"""Resident memory per node: N ranks sharing one copy of the weights vs each holding its own.

Run:  python benchmarks/memory_sharing.py --ranks 4 --mb 256
It starts real Open MPI ranks on this node (mpirun --oversubscribe) twice:
  private  every rank builds its own copy of a model state (torch tensors)
  shared   the node root puts it in an MPI shared-memory window
           (hetrun.runtime.shared_weights.SharedWeights); ranks view it
Each rank touches every weight (a full sum, as a forward pass reads them),
then reports Rss and Pss from /proc/self/smaps_rollup. Pss splits shared
pages between the processes mapping them, so the node total of Pss is the
real resident memory of the node. A baseline with no weights at all is
measured too, so the table shows the cost of the weights alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hetrun.runtime.mpi_launch import loopback_mpi_env, mpirun_argv


def smaps_rollup(pid: int | str = "self") -> dict[str, int]:
    """Rss/Pss/Shared_* of a process in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            out[key.strip()] = int(parts[0]) * 1024
    return out


def make_state(mb: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    n = mb * (1 << 20) // 4
    # A few layers, like a policy/LM: total ~mb MiB of fp32.
    sizes = [n // 2, n // 4, n // 8, n - n // 2 - n // 4 - n // 8]
    return {f"layer{i}.weight": torch.randn(s, generator=g) for i, s in enumerate(sizes)}


def worker(mode: str, mb: int, out: str) -> None:
    import torch
    from hetrun.runtime.shared_weights import SharedWeights
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    shared = None
    if mode == "private":
        tensors = make_state(mb)
    elif mode == "shared":
        template = make_state(mb) if node.Get_rank() == 0 else None
        shared = SharedWeights.create(node, template)
        del template  # the root keeps only the shared copy
        tensors = shared.tensors
    else:
        tensors = {}
    total = sum(float(t.sum()) for t in tensors.values())  # touch every page
    import gc

    gc.collect()
    comm.Barrier()
    mem = smaps_rollup()
    rows = comm.gather({"rank": comm.Get_rank(), "rss": mem["Rss"], "pss": mem["Pss"],
                        "checksum": total}, root=0)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps(rows))
    comm.Barrier()
    if shared is not None:
        shared.free()
    torch.set_num_threads(1)


def run(mode: str, ranks: int, mb: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        cmd = mpirun_argv(ranks, [sys.executable, __file__, "--worker", mode, "--mb", str(mb), "--out", out])
        subprocess.run(cmd, env=loopback_mpi_env(), check=True, timeout=600)
        return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=int, default=256, help="model state size in MiB (fp32)")
    ap.add_argument("--worker", choices=["private", "shared", "none"])
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.mb, args.out)
        return
    results = {m: run(m, args.ranks, args.mb) for m in ("none", "private", "shared")}
    base = sum(r["pss"] for r in results["none"])
    print(f"{args.ranks} ranks on one node, model state {args.mb} MiB fp32\n")
    print(f"{'mode':<8} {'node Pss MiB':>13} {'weights MiB':>12} {'per-rank Rss MiB':>17}")
    for mode, rows in results.items():
        pss = sum(r["pss"] for r in rows)
        rss = sum(r["rss"] for r in rows) / len(rows)
        print(f"{mode:<8} {pss / 2**20:>13.0f} {(pss - base) / 2**20:>12.0f} {rss / 2**20:>17.0f}")
    checks = {round(r["checksum"], 2) for m in ("private", "shared") for r in results[m]}
    print(f"\nall ranks read identical weights: {len(checks) == 1}")
    priv = sum(r["pss"] for r in results["private"]) - base
    shr = sum(r["pss"] for r in results["shared"]) - base
    print(f"weights resident per node: shared/private = {shr / priv:.3f} "
          f"(ideal 1/{args.ranks} = {1 / args.ranks:.3f})")


if __name__ == "__main__":
    main()

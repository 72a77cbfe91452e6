"""Gradient sync overlapped with backward vs after it, on real ranks (gloo, CPU).

Run:  python benchmarks/grad_sync_overlap.py --ranks 2 --width 1024 --layers 8 --steps 10
Each rank runs forward+backward of an MLP on its own data, then averages the
gradients across ranks, three ways, side by side in one run:
  none      no sync at all (compute-only floor)
  after     one flat all_reduce after backward (the plain data-parallel loop)
  bucketed  the same 1 MiB buckets as overlap, all launched after backward
  overlap   hetrun.runtime.grad_sync.BucketedGradSync: 1 MiB buckets launched
            from post-accumulate-grad hooks during backward, waited at the end
Reports the median step time per mode. Results are identical between after
and overlap (checked). On a machine whose cores are all busy with compute
the gloo threads have nothing free to run on, so the overlap can only hide
communication when there is idle CPU or a real network to wait for.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

from hetrun.runtime.mpi_launch import init_loopback_gloo, loopback_mpi_env, mpirun_argv


def worker(args: argparse.Namespace) -> None:

    import torch
    import torch.distributed as dist
    from hetrun.runtime.grad_sync import BucketedGradSync
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    init_loopback_gloo(comm, timeout_s=120)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    params = list(model.parameters())
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))
    modes = ("none", "after", "bucketed", "overlap")
    results: dict[str, list[float]] = {m: [] for m in modes}
    grads: dict[str, torch.Tensor] = {}
    for step in range(args.steps + 2):
        for mode in modes:
            model.zero_grad(set_to_none=True)
            comm.Barrier()
            t0 = time.perf_counter()
            loss = model(x).pow(2).mean()
            if mode in ("overlap", "bucketed"):
                gs = BucketedGradSync(params, dist.group.WORLD, size)
                if mode == "overlap":
                    gs.arm()
                loss.backward()
                gs.disarm()
                gs.finish()
            else:
                loss.backward()
                if mode == "after":
                    flat = torch.cat([p.grad.reshape(-1) for p in params])
                    dist.all_reduce(flat)
                    flat /= size
                    off = 0
                    for p in params:
                        p.grad.copy_(flat[off : off + p.numel()].view_as(p.grad))
                        off += p.numel()
            dt = time.perf_counter() - t0
            if step >= 2:
                results[mode].append(dt)
            if mode != "none":
                grads[mode] = torch.cat([p.grad.reshape(-1) for p in params]).clone()
    same = all(bool(torch.allclose(grads["after"], grads[m], rtol=1e-6, atol=1e-7))
               for m in ("bucketed", "overlap"))
    rows = comm.gather({k: statistics.median(v) for k, v in results.items()}, root=0)
    if rank == 0:
        print(json.dumps({"ranks": size, "params": sum(p.numel() for p in params),
                          "median_s": {k: max(r[k] for r in rows) for k in results},
                          "identical": same}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    cmd = mpirun_argv(args.ranks, [sys.executable, __file__, "--worker", "--width", str(args.width),
                                   "--layers", str(args.layers), "--batch", str(args.batch),
                                   "--steps", str(args.steps)])
    out = subprocess.run(cmd, env=loopback_mpi_env(GLOO_SOCKET_IFNAME="lo"), capture_output=True,
                         text=True, check=True, timeout=900)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    m = res["median_s"]
    print(f"{res['ranks']} ranks on {socket.gethostname()}, MLP {res['params'] / 1e6:.1f}M params, "
          f"grads {res['params'] * 4 / 2**20:.0f} MiB")
    for k in ("none", "after", "bucketed", "overlap"):
        print(f"  {k:<8} step {m[k] * 1000:8.1f} ms   sync cost {(m[k] - m['none']) * 1000:7.1f} ms")
    print(f"  identical gradients after/bucketed/overlap: {res['identical']}")


if __name__ == "__main__":
    main()

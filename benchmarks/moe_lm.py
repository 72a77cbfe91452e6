"""MoE LM benchmark: tokens/s and all-to-all time share per step at 1, 2 and 4 ranks.

Real Open MPI ranks (mpirun --oversubscribe), real training steps of
examples/moe_lm.py (exact all-to-all), two transports side by side in the same
run: our mpi4py ``Alltoallv`` path and torch.distributed's gloo
``all_to_all_single`` (the peer: what a plain PyTorch expert-parallel
implementation on CPU would use). Plus the bare exchange at two sizes.

    python benchmarks/moe_lm.py                       # 3 interleaved rounds, markdown tables
    python benchmarks/moe_lm.py --rounds 1 --steps 5  # quicker

Each step = one micro-batch per rank (batch x seq bytes), forward + backward
+ gradient averaging of the replicated parameters (gloo all_reduce, as the
runtime's sync) + AdamW step. The all-to-all time is what the exchanges took
on each rank, waiting for slower peers included (on 2 shared cores the ranks
are oversubscribed, so waiting is part of the cost). Figures go to
benchmarks/moe.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetrun.runtime.mpi_launch import init_loopback_gloo, loopback_mpi_env, mpirun_argv

TRANSPORTS = ["mpi", "mpi-block", "torch"]
NAMES = {
    "mpi": "mpi4py Ialltoallv, polite wait (hetrun default on CPU)",
    "mpi-block": "mpi4py Alltoallv, blocking (spins)",
    "torch": "torch.distributed gloo all_to_all_single (peer)",
}

# ------------------------------------------------------------------ rank side


def _rank_lm(transport: str, steps: int, warmup: int, batch: int, seq: int) -> dict:
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from hetrun.runtime.context import RankContext
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size > 1:
        # The runtime's gradient sync is gloo all_reduce over the component, in every mode.
        init_loopback_gloo(comm)
    ctx = RankContext(
        rank=rank, world_size=size, component="learner", comp_rank=rank, comp_size=size,
        group=None, comm=comm, device="cpu", seed=0, run_dir=Path("."),
        comms={"forward_codec": "none", "backward_codec": "none"},
    )
    work = MoELMWorkload(ctx, batch_size=batch, seq_len=seq, corpus_bytes=1_000_000,
                         transport=transport.split("-")[0] if size > 1 else "auto")
    if transport == "mpi-block" and work.comm is not None:
        work.comm.poll = "block"

    def step(it: int) -> dict[str, float]:
        loss = work.forward(work.next_batch(it, 0), 0, 1)
        work.backward(loss)
        if size > 1:
            import torch.distributed as dist

            for p in work.parameters_to_sync():
                dist.all_reduce(p.grad)
                p.grad.div_(size)
        return work.optimize()

    for it in range(warmup):
        step(it)
    comm.Barrier()
    times, a2a, sent = [], [], []
    bytes0 = work.comm.stats["bytes_sent"] if work.comm else 0.0
    start = time.perf_counter()
    for it in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        metrics = step(it)
        times.append(time.perf_counter() - t0)
        a2a.append(metrics["a2a_seconds"])
    total = time.perf_counter() - start
    if work.comm:
        sent.append(work.comm.stats["bytes_sent"] - bytes0)
    return {
        "rank": rank, "size": size, "transport": transport, "total": total, "times": times,
        "a2a": a2a, "bytes_sent": sum(sent), "tokens": steps * batch * seq,
        "last_loss": metrics["loss"],
    }


def _rank_exchange(transport: str, rows_list: list[int], width: int, reps: int) -> dict:
    import torch
    from hetrun.runtime.comms.alltoall import AllToAllComm, exact_all_to_all
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    if transport == "torch":
        init_loopback_gloo(comm)
        a2a = AllToAllComm.from_torch(None)
    else:
        a2a = AllToAllComm.from_mpi(comm, poll="block" if transport == "mpi-block" else "polite")
    out = {}
    for rows in rows_list:
        per_peer = rows // size
        splits = [per_peer] * size
        x = torch.randn(per_peer * size, width)
        samples = []
        for i in range(reps + 2):
            comm.Barrier()
            t0 = time.perf_counter()
            exact_all_to_all(x, splits, splits, a2a)
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if i >= 2:
                samples.append(dt)
        out[str(rows)] = statistics.median(samples)
    return {"rank": comm.Get_rank(), "size": size, "transport": transport, "median_s": out}


# -------------------------------------------------------------- orchestrator


def _mpirun(np_: int, args: list[str], out_dir: Path) -> list[dict]:
    env = loopback_mpi_env()
    cmd = mpirun_argv(np_, [sys.executable, str(Path(__file__).resolve()), "--rank-mode", *args,
                            "--out", str(out_dir)])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark ranks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]
    for p in out_dir.glob("rank-*.json"):
        p.unlink()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--rank-mode", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.rank_mode is not None:
        kind, transport = args.rank_mode[0], args.rank_mode[1]
        if kind == "lm":
            res = _rank_lm(transport, args.steps, args.warmup, args.batch, args.seq)
        else:
            res = _rank_exchange(transport, [4096, 65536], 64, 10)
        Path(args.out, f"rank-{res['rank']}.json").write_text(json.dumps(res))
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()  # a live gloo group at exit aborts the process
        return

    ranks = [int(r) for r in args.ranks.split(",")]
    configs = [(np_, t) for np_ in ranks for t in (["mpi"] if np_ == 1 else TRANSPORTS)]
    load0 = os.getloadavg()[0]
    print(f"# MoE LM benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs, steps={args.steps}, batch={args.batch}, seq={args.seq}, "
          f"rounds={args.rounds}, load average at start {load0:.1f})\n")
    rows: dict[tuple[int, str], list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        # Rounds interleave the configurations, so drifting load hits them all alike;
        # each figure is the median over rounds.
        for _ in range(args.rounds):
            for np_, transport in configs:
                res = _mpirun(np_, ["lm", transport, "--steps", str(args.steps), "--warmup",
                                    str(args.warmup), "--batch", str(args.batch), "--seq",
                                    str(args.seq)], out)
                busy = sum(sum(r["times"]) for r in res)
                rows[(np_, transport)].append({
                    "tok_s": sum(r["tokens"] for r in res) / max(r["total"] for r in res),
                    "step_ms": statistics.median(t for r in res for t in r["times"]) * 1e3,
                    "share": sum(sum(r["a2a"]) for r in res) / busy,
                    "a2a_ms": sum(sum(r["a2a"]) for r in res) / len(res) / args.steps * 1e3,
                    "mb": sum(r["bytes_sent"] for r in res) / len(res) / args.steps / 1e6,
                    "loss": statistics.mean(r["last_loss"] for r in res),
                })
        print("| ranks | all-to-all transport | tokens/s (all ranks) | step ms | all-to-all "
              "share of step | all-to-all ms/step/rank | MB sent/step/rank | loss at end |")
        print("|---|---|---|---|---|---|---|---|")
        for (np_, transport), runs in rows.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            spread = f" ({min(r['tok_s'] for r in runs):,.0f}-{max(r['tok_s'] for r in runs):,.0f})"
            name = "none (1 rank, all experts local)" if np_ == 1 else NAMES[transport]
            print(f"| {np_} | {name} | {med['tok_s']:,.0f}{spread} | {med['step_ms']:.1f} | "
                  f"{med['share']:.1%} | {med['a2a_ms']:.1f} | {med['mb']:.2f} | "
                  f"{med['loss']:.3f} |", flush=True)
        print("\nBare exchange (float32 rows of 64, uniform splits, median of 10 after 2 warm-up, "
              "time of the slowest rank):\n")
        print("| ranks | rows/rank | MB/rank | " + " | ".join(f"{NAMES[t]} ms" for t in TRANSPORTS)
              + " |")
        print("|---|---|---|" + "---|" * len(TRANSPORTS))
        for np_ in [r for r in ranks if r > 1]:
            by = {t: _mpirun(np_, ["exchange", t], out)[0]["median_s"] for t in TRANSPORTS}
            for n_rows in by["mpi"]:
                mb = int(n_rows) * 64 * 4 / 1e6
                cells = " | ".join(f"{by[t][n_rows] * 1e3:.2f}" for t in TRANSPORTS)
                print(f"| {np_} | {n_rows} | {mb:.1f} | {cells} |", flush=True)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()

"""MoE LM trained with and without all-to-all compression: loss curves side by side.

    python benchmarks/kernels_convergence.py [--steps 150] [--ranks 2] [--out benchmarks/results]

Real Open MPI ranks (expert parallel over ``--ranks``), the shipped MoE
example (examples/moe_lm.py), same seed and data order for both runs:
``comms: {forward_codec: none, backward_codec: none}`` vs the defaults
``{forward_codec: int8, backward_codec: onebit_ef}`` (``--runs`` picks others). Prints the mean loss of
the last 20 steps of each and their relative difference (target: within 1%),
the bytes each run sent, and writes both curves to ``moe_convergence.png``
(and ``.json``) in ``--out``. Needs matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hetrun.runtime.mpi_launch import loopback_mpi_env, mpirun_argv

DEFAULT_RUNS = "none:none,int8:onebit_ef"


def _runs(spec: str) -> dict[str, tuple[str, str]]:
    """``fwd:bwd,fwd:bwd`` -> {label: (forward_codec, backward_codec)}; the first is the baseline."""
    return {f"fwd {f} / bwd {b}": (f, b) for f, b in (r.split(":") for r in spec.split(","))}


def _rank(steps: int, batch: int, seq: int, out: str, spec: str) -> None:
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from hetrun.runtime.context import RankContext
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    result = {}
    for label, (fwd, bwd) in _runs(spec).items():
        ctx = RankContext(
            rank=rank, world_size=size, component="learner", comp_rank=rank, comp_size=size,
            group=None, comm=comm, device="cpu", seed=0, run_dir=Path("."),
            comms={"forward_codec": fwd, "backward_codec": bwd},
        )
        work = MoELMWorkload(ctx, batch_size=batch, seq_len=seq, corpus_bytes=1_000_000)
        losses = []
        for it in range(steps):
            loss = work.forward(work.next_batch(it, 0), 0, 1)
            work.backward(loss)
            for p in work.parameters_to_sync():
                comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
                p.grad.div_(size)
            work.optimize()
            losses.append(comm.allreduce(float(loss.detach()), op=MPI.SUM) / size)
        sent = comm.allreduce(work.comm.stats["bytes_sent"] if work.comm else 0.0, op=MPI.SUM)
        result[label] = {"loss": losses, "bytes_sent": sent}
    if rank == 0:
        Path(out).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="fwd:bwd codec pairs; the first is the baseline")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res_path = Path(tmp, "res.json")
        cmd = mpirun_argv(args.ranks, [sys.executable, __file__, "--rank", str(args.steps), str(args.batch),
                                       str(args.seq), str(res_path), args.runs])
        proc = subprocess.run(cmd, env=loopback_mpi_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
        res = json.loads(res_path.read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_convergence.json").write_text(json.dumps(res))
    tail = {k: sum(v["loss"][-20:]) / len(v["loss"][-20:]) for k, v in res.items()}
    base = next(iter(tail.values()))
    print(f"MoE LM, {args.ranks} ranks, {args.steps} steps, batch {args.batch} x seq {args.seq}")
    for k, v in res.items():
        print(f"  {k:26s} first loss {v['loss'][0]:.4f}  mean of last 20 {tail[k]:.4f}  "
              f"all-to-all bytes sent {v['bytes_sent'] / 1e6:.1f} MB")
    for k, v in list(tail.items())[1:]:
        print(f"  {k} vs baseline: {100 * (v - base) / base:+.2f}% (target within +-1%)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  matplotlib not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, v in res.items():
        ax.plot(range(1, len(v["loss"]) + 1), v["loss"], label=k, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title(f"MoE LM, {args.ranks} expert-parallel ranks: exact vs compressed all-to-all")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "moe_convergence.png", dpi=120)
    print(f"  plot: {out / 'moe_convergence.png'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        _rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        main()

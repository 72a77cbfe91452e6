"""MoE LM trained with and without all-to-all compression: loss curves side by side.

    python benchmarks/kernels_convergence.py [--steps 400] [--seeds 0,1,2] [--ranks 2]
        [--runs none:none,int8:onebit_ef,int4:int4] [--out benchmarks/results]

Real Open MPI ranks (expert parallel over ``--ranks``), the shipped MoE
example (examples/moe_lm.py); per seed, every run has the same initial weights
and data order. The first of ``--runs`` is the baseline (exact); the default
list adds the default codecs (int8 forward, 1-bit EF backward, with
``runtime/comms/compressed``'s per-direction blocks and scale formats) and int4
both ways. Per run it prints the training loss (mean of the last 20 steps) and
the final held-out loss (``MoELMWorkload.evaluate``: a fixed set of held-out
windows, less noisy), each vs the baseline of the same seed, averaged over
seeds, the worst seed, and the all-to-all volume and its cut (held-out
evaluation traffic excluded). Writes the curves of the first seed to
``moe_convergence.png`` (and all data to ``.json``) in ``--out``; needs
matplotlib for the plot. Runs are deterministic: machine load changes the time,
not the figures.
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

DEFAULT_RUNS = "none:none,int8:onebit_ef,int4:int4"


def _runs(spec: str) -> dict[str, tuple[str, str]]:
    """``fwd:bwd,fwd:bwd`` -> {label: (forward_codec, backward_codec)}; the first is the baseline.

    A codec may carry a block size and a scale format, ``int8@512:onebit_ef@64/bf16``
    (else the defaults of ``runtime/comms/compressed``), passed through
    ``$HETRUN_A2A_BLOCK_<DIRECTION>`` and ``$HETRUN_A2A_SCALE_<DIRECTION>``.
    """
    return {f"fwd {f} / bwd {b}": (f, b) for f, b in (r.split(":") for r in spec.split(","))}


def _codec_opts(token: str) -> tuple[str, str | None, str | None]:
    name, _, opts = token.partition("@")
    block, _, scale = opts.partition("/")
    return name, (block or None), (scale or None)


def _rank(steps: int, batch: int, seq: int, out: str, spec: str, eval_every: int, seeds: str) -> None:
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from hetrun.runtime.context import RankContext
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    result = {}
    for seed, (label, (fwd_tok, bwd_tok)) in (
        (int(sd), run) for sd in seeds.split(",") for run in _runs(spec).items()
    ):
        (fwd, *fopts), (bwd, *bopts) = _codec_opts(fwd_tok), _codec_opts(bwd_tok)
        for direction, opts in (("FORWARD", fopts), ("BACKWARD", bopts)):
            for knob, value in zip(("BLOCK", "SCALE"), opts, strict=True):
                os.environ.pop(f"HETRUN_A2A_{knob}_{direction}", None)
                if value:
                    os.environ[f"HETRUN_A2A_{knob}_{direction}"] = value
        ctx = RankContext(
            rank=rank, world_size=size, component="learner", comp_rank=rank, comp_size=size,
            group=None, comm=comm, device="cpu", seed=seed, run_dir=Path("."),
            comms={"forward_codec": fwd, "backward_codec": bwd},
        )
        work = MoELMWorkload(ctx, batch_size=batch, seq_len=seq, corpus_bytes=1_000_000)
        losses: list[float] = []
        evals: list[tuple[int, float]] = []
        sent = 0.0
        for it in range(steps):
            loss = work.forward(work.next_batch(it, 0), 0, 1)
            work.backward(loss)
            for p in work.parameters_to_sync():
                comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
                p.grad.div_(size)
            work.optimize()
            losses.append(comm.allreduce(float(loss.detach()), op=MPI.SUM) / size)
            if (it + 1) % eval_every == 0 or it + 1 == steps:
                # Held-out loss on a fixed set of windows (less noisy than the training
                # loss); its all-to-all bytes are left out of the training volume.
                before = work.comm.stats["bytes_sent"] if work.comm else 0.0
                evals.append((it + 1, work.evaluate()["eval_loss"]))
                if work.comm:
                    sent -= work.comm.stats["bytes_sent"] - before
        sent += work.comm.stats["bytes_sent"] if work.comm else 0.0
        sent = comm.allreduce(sent, op=MPI.SUM)
        result.setdefault(label, []).append(
            {"seed": seed, "loss": losses, "eval": evals, "bytes_sent": sent}
        )
    if rank == 0:
        Path(out).write_text(json.dumps(result))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _report(res: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """Per run: training loss (mean of the last 20 steps) and final held-out loss vs the
    baseline of the same seed, averaged over seeds, and the all-to-all volume cut."""
    base_label = next(iter(res))
    base = res[base_label]
    print(f"MoE LM, {args.ranks} ranks, {args.steps} steps, batch {args.batch} x seq {args.seq}, "
          f"seeds {args.seeds} (first run is the baseline; target: within 1% of its loss, "
          "volume cut >= 85%)")
    print(f"  {'run':44s} {'train last20':>12s} {'vs base':>8s} {'held-out':>9s} {'vs base':>8s} "
          f"{'worst':>7s} {'a2a MB':>8s} {'cut':>7s}")
    for k, runs in res.items():
        tail = [_mean(r["loss"][-20:]) for r in runs]
        final = [r["eval"][-1][1] for r in runs]
        btail = [_mean(b["loss"][-20:]) for b in base]
        bfinal = [b["eval"][-1][1] for b in base]
        dt = [100 * (t - b) / b for t, b in zip(tail, btail, strict=True)]
        de = [100 * (f - b) / b for f, b in zip(final, bfinal, strict=True)]
        cut = 100 * (1 - _mean([r["bytes_sent"] for r in runs]) / _mean([b["bytes_sent"] for b in base]))
        print(f"  {k:44s} {_mean(tail):12.4f} {_mean(dt):+7.2f}% {_mean(final):9.4f} "
              f"{_mean(de):+7.2f}% {max(dt + de):+6.2f}% {_mean([r['bytes_sent'] for r in runs]) / 1e6:8.1f} "
              f"{cut:6.2f}%")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--eval-every", type=int, default=50, help="held-out evaluation period (steps)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (model init and data order)")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="fwd:bwd codec pairs; the first is the baseline")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res_path = Path(tmp, "res.json")
        cmd = mpirun_argv(args.ranks, [sys.executable, __file__, "--rank", str(args.steps), str(args.batch),
                                       str(args.seq), str(res_path), args.runs,
                                       str(args.eval_every), args.seeds])
        proc = subprocess.run(cmd, env=loopback_mpi_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
        res = json.loads(res_path.read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_convergence.json").write_text(json.dumps(res))
    _report(res, args)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  matplotlib not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, per_seed in res.items():
        v = per_seed[0]
        ax.plot(range(1, len(v["loss"]) + 1), v["loss"], label=k, linewidth=1)
        ax.plot([e[0] for e in v["eval"]], [e[1] for e in v["eval"]], "o--", markersize=3,
                label=f"{k} (held-out)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_title(f"MoE LM, {args.ranks} expert-parallel ranks: exact vs compressed all-to-all")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "moe_convergence.png", dpi=120)
    print(f"  plot: {out / 'moe_convergence.png'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        _rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]),
              sys.argv[8])
    else:
        main()

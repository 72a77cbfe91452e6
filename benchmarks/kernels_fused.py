"""Fused ops vs their eager compositions on CPU, side by side in one run.

    python benchmarks/kernels_fused.py [--reps 9] [--compile]

One thread. Each round times every variant once (forward + backward);
medians over rounds. LayerNorm + Linear + GELU: eager
(``F.layer_norm -> F.linear -> F.gelu``) vs ``kernels.fused_ln_linear`` (and,
with ``--compile``, ``torch.compile`` of the eager composition, compile time
excluded and printed). MoE routing: ``gate_topk_permute`` + expert +
``unpermute_combine`` vs the reference versions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _bench(variants: dict, reps: int) -> dict[str, float]:
    for f in variants.values():
        f()
        f()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for k, f in variants.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from hetrun.kernels.fused_ln_linear import ln_linear_gelu, ln_linear_gelu_reference
    from hetrun.kernels.moe_dispatch import (
        gate_topk_permute,
        gate_topk_permute_reference,
        unpermute_combine,
        unpermute_combine_reference,
    )

    print("LayerNorm + Linear + GELU, fp32, forward + backward, 1 thread (median ms)")
    for tokens, hdim, fdim in ((4096, 128, 512), (2048, 256, 1024), (8192, 64, 256)):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, hdim, generator=g, requires_grad=True)
        lnw = (1 + 0.1 * torch.randn(hdim, generator=g)).requires_grad_()
        lnb = (0.1 * torch.randn(hdim, generator=g)).requires_grad_()
        w = (torch.randn(fdim, hdim, generator=g) * hdim**-0.5).requires_grad_()
        b = torch.zeros(fdim).requires_grad_()
        gy = torch.randn(tokens, fdim, generator=g)
        ps = (x, lnw, lnb, w, b)

        def step(fn, ps=ps, gy=gy):
            return lambda: fn(*ps).backward(gy)

        variants = {"eager": step(ln_linear_gelu_reference), "fused": step(ln_linear_gelu)}
        if args.compile:
            t0 = time.perf_counter()
            compiled = torch.compile(ln_linear_gelu_reference)
            compiled(*ps).backward(gy)
            print(f"  torch.compile: first call (compile) {time.perf_counter() - t0:.1f} s")
            variants["torch.compile"] = step(compiled)
        med = _bench(variants, args.reps)
        cells = "  ".join(f"{k} {v * 1e3:7.2f}" for k, v in med.items())
        print(f"  T={tokens} H={hdim} F={fdim}: {cells}  fused speedup {med['eager'] / med['fused']:.2f}x")

    print("\nMoE gate + top-k + permute, expert, weighted combine; forward + backward (median ms)")
    for tokens, hdim, experts, k in ((4096, 128, 16, 2), (2048, 256, 8, 2)):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(tokens, hdim, generator=g, requires_grad=True)
        gw = torch.randn(experts, hdim, generator=g, requires_grad=True)
        ew = (torch.randn(hdim, hdim, generator=g) * hdim**-0.5).requires_grad_()
        gy = torch.randn(tokens, hdim, generator=g)

        def moe(dispatch, combine, x=x, gw=gw, ew=ew, gy=gy, k=k, tokens=tokens):
            def run() -> None:
                d = dispatch(x, gw, k)
                y = torch.relu(d.permuted_x @ ew)
                combine(y, d.token_index, d.weights, tokens).backward(gy)

            return run

        med = _bench(
            {"reference": moe(gate_topk_permute_reference, unpermute_combine_reference),
             "fused": moe(gate_topk_permute, unpermute_combine)},
            args.reps,
        )
        print(f"  T={tokens} H={hdim} E={experts} k={k}: reference {med['reference'] * 1e3:7.2f}  "
              f"fused {med['fused'] * 1e3:7.2f}  speedup {med['reference'] / med['fused']:.2f}x")


if __name__ == "__main__":
    main()

"""Fused ops vs their eager compositions on CPU, side by side in one run.

    python benchmarks/kernels_fused.py [--reps 9] [--threads 1,2] [--compile] [--quick]

LayerNorm + Linear + GELU (fp32, exact-erf GELU), per shape and thread count,
every variant timed once per round (interleaved), medians over rounds:

forward + backward (autograd, all five inputs need gradients)
  eager          F.layer_norm -> F.linear -> F.gelu
  fused/aten     kernels.fused_ln_linear with every CPU fast path off
  fused/+cgelu   ... + C GELU forward, and C GELU backward fused with the bias-gradient sum
  fused/+dnn     ... + oneDNN forward and input-gradient GEMMs
  fused          the default: C GELU both ways, oneDNN input-gradient GEMM,
                 oneDNN forward GEMM only for H <= 128
  fused/all      ... + oneDNN forward GEMM at every H (not the default: at
                 H >= 256 it moves the forward 8-9e-7 from eager, budget 1e-6)
  gemm floor     the three GEMMs alone (MKL addmm, gh @ W, gh^T @ x): no
                 fused op doing the same GEMMs can beat this
  compile        torch.compile of the eager function (--compile; compile
                 time printed, excluded)
forward only (torch.no_grad)
  eager, fused/aten, fused, fused/all, dnn-epilogue (one oneDNN linear with a GELU post-op; its
  max relative error vs eager is printed, spec is 1e-6), gemm floor (addmm)

"max x" = eager / gemm floor, the best speedup any fusion could reach.
Then the swapped pieces alone (C GELU forward / backward+bias-sum vs ATen,
oneDNN vs MKL input-gradient GEMM), and MoE gate + top-k + permute / combine,
fused vs reference.
Writes benchmarks/results/kernels_fused.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

MOE_SHAPES = ((4096, 64, 256), (4096, 128, 512), (2048, 256, 1024), (8192, 64, 256))
TRANSFORMER_SHAPES = ((8192, 256, 1024), (4096, 512, 2048))
#: kernels.fused_ln_linear.cpu_paths with every CPU fast path off (the plain ATen fused op).
ALL_OFF = {"native_gelu_backward": False, "native_gelu_forward": False,
           "onednn_grad_input": False, "onednn_forward_max_h": 0}


def _bench(variants: dict[str, Callable[..., object]], reps: int) -> dict[str, float]:
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


def _row(label: str, med: dict[str, float]) -> str:
    cells = "  ".join(f"{k} {v * 1e3:8.2f}" for k, v in med.items())
    best = {k: med["eager"] / v for k, v in med.items() if k.startswith("fused")}
    return f"  {label}: {cells}  | fused {best['fused']:.2f}x  max x {med['eager'] / med['gemm floor']:.2f}"


def _with(paths: dict[str, bool | int], fn, args) -> torch.Tensor:
    from hetrun.kernels.fused_ln_linear import cpu_paths

    with cpu_paths(**paths):
        return fn(*args)


def ln_linear(shapes, threads: int, reps: int, compile_: bool) -> list[dict]:
    from hetrun.kernels.fused_ln_linear import cpu_paths, ln_linear_gelu, ln_linear_gelu_reference

    lp = torch.ops.mkldnn._linear_pointwise
    torch.set_num_threads(threads)
    out = []
    for tokens, hdim, fdim in shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, hdim, generator=g, requires_grad=True)
        lnw = (1 + 0.1 * torch.randn(hdim, generator=g)).requires_grad_()
        lnb = (0.1 * torch.randn(hdim, generator=g)).requires_grad_()
        w = (torch.randn(fdim, hdim, generator=g) * hdim**-0.5).requires_grad_()
        b = (0.1 * torch.randn(fdim, generator=g)).requires_grad_()
        gy = torch.randn(tokens, fdim, generator=g)
        ps = (x, lnw, lnb, w, b)
        xd, wd, bd, gyw = x.detach(), w.detach(), b.detach(), gy @ w.detach()

        def train(fn, ps=ps, gy=gy, **paths):
            def run() -> None:
                with cpu_paths(**paths):
                    fn(*ps).backward(gy)
            return run

        def floor_train(xd=xd, wd=wd, bd=bd, gy=gy) -> None:
            torch.addmm(bd, xd, wd.t())
            torch.mm(gy, wd)
            torch.mm(gy.t(), xd)

        variants = {
            "eager": train(ln_linear_gelu_reference),
            "fused/aten": train(ln_linear_gelu, **ALL_OFF),
            "fused/+cgelu": train(ln_linear_gelu, **{**ALL_OFF, "native_gelu_backward": True, "native_gelu_forward": True}),
            "fused/+dnn": train(ln_linear_gelu, **{**ALL_OFF, "onednn_grad_input": True,
                                                   "onednn_forward_max_h": 1 << 30}),
            "fused": train(ln_linear_gelu),
            "fused/all": train(ln_linear_gelu, onednn_forward_max_h=1 << 30),
            "gemm floor": floor_train,
        }
        compile_s = None
        if compile_:
            t0 = time.perf_counter()
            compiled = torch.compile(ln_linear_gelu_reference)
            compiled(*ps).backward(gy)
            compile_s = time.perf_counter() - t0
            variants["compile"] = train(compiled)
        del gyw
        train_med = _bench(variants, reps)

        def no_grad(fn):
            def run() -> None:
                with torch.no_grad():
                    fn()
            return run

        lnwd, lnbd = lnw.detach(), lnb.detach()
        ln_out = torch.nn.functional.layer_norm(xd, (hdim,), lnwd, lnbd)

        def dnn_epilogue(xd=xd, lnwd=lnwd, lnbd=lnbd, wd=wd, bd=bd) -> torch.Tensor:
            return lp(torch.nn.functional.layer_norm(xd, (xd.shape[1],), lnwd, lnbd), wd, bd, "gelu", [], "none")

        fwd = {
            "eager": no_grad(lambda ps=ps: ln_linear_gelu_reference(*ps)),
            "fused/aten": no_grad(lambda ps=ps: _with(ALL_OFF, ln_linear_gelu, ps)),
            "fused": no_grad(lambda ps=ps: ln_linear_gelu(*ps)),
            "fused/all": no_grad(lambda ps=ps: _with({"onednn_forward_max_h": 1 << 30}, ln_linear_gelu, ps)),
            "dnn-epilogue": no_grad(dnn_epilogue),
            "gemm floor": no_grad(lambda bd=bd, ln_out=ln_out, wd=wd: torch.addmm(bd, ln_out, wd.t())),
        }
        fwd_med = _bench(fwd, reps)
        with torch.no_grad():
            ref = ln_linear_gelu_reference(*ps)
            dnn_err = float((dnn_epilogue() - ref).abs().max() / ref.abs().max())
            fused_err = float((ln_linear_gelu(*ps) - ref).abs().max() / ref.abs().max())
            all_err = float((_with({"onednn_forward_max_h": 1 << 30}, ln_linear_gelu, ps) - ref).abs().max()
                            / ref.abs().max())
        label = f"T={tokens} H={hdim} F={fdim}"
        print(_row(label + " fwd+bwd", train_med)
              + (f"  (compile {compile_s:.1f} s)" if compile_s is not None else ""))
        fb = fwd_med["eager"]
        print(f"  {label} fwd    : " + "  ".join(f"{k} {v * 1e3:8.2f}" for k, v in fwd_med.items())
              + f"  | fused {fb / fwd_med['fused']:.2f}x  dnn-epilogue {fb / fwd_med['dnn-epilogue']:.2f}x"
              f"  max x {fb / fwd_med['gemm floor']:.2f}  (rel err: fused {fused_err:.1e}, fused/all {all_err:.1e},"
              f" dnn-epilogue {dnn_err:.1e})")
        out.append({"threads": threads, "tokens": tokens, "hdim": hdim, "fdim": fdim,
                    "train_ms": {k: v * 1e3 for k, v in train_med.items()},
                    "forward_ms": {k: v * 1e3 for k, v in fwd_med.items()},
                    "forward_rel_err": {"fused": fused_err, "fused/all": all_err, "dnn-epilogue": dnn_err},
                    "compile_s": compile_s})
    return out


def components(threads: int, reps: int) -> list[dict]:
    """The pieces the default path swaps, alone: C GELU vs ATen, oneDNN vs MKL input-gradient GEMM."""
    from hetrun.kernels import fused_native

    torch.set_num_threads(threads)
    lp = torch.ops.mkldnn._linear_pointwise
    have_c = fused_native.lib() is not None
    print(f"\nComponents alone, {threads} thread(s), median ms"
          + ("" if have_c else " (no C compiler: C kernels not built)"))
    out = []
    for tokens, hdim, fdim in MOE_SHAPES:
        g = torch.Generator().manual_seed(2)
        h = torch.randn(tokens, fdim, generator=g) * 2
        gy = torch.randn(tokens, fdim, generator=g)
        w = torch.randn(fdim, hdim, generator=g) * hdim**-0.5
        w_t = w.t().contiguous()
        buf, buf2 = torch.empty_like(h), torch.empty_like(h)
        v: dict[str, Callable[..., object]] = {
            "aten gelu": lambda h=h, buf=buf: torch.ops.aten.gelu.out(h, out=buf),
            "aten gelu_bwd+sum": lambda gy=gy, h=h, buf=buf: torch.ops.aten.gelu_backward.grad_input(
                gy, h, grad_input=buf).sum(0),
            "mkl gh@W": lambda gy=gy, w=w: gy @ w,
            "dnn gh@W": lambda gy=gy, w_t=w_t: lp(gy, w_t, None, "none", [], ""),
        }
        if have_c:
            v["C gelu"] = lambda h=h, buf2=buf2: fused_native.gelu_forward(h, buf2)
            v["C gelu_bwd+sum"] = lambda gy=gy, h=h, buf2=buf2: fused_native.gelu_backward_bias(gy, h, buf2)
        med = _bench(v, reps)
        print(f"  T={tokens} H={hdim} F={fdim}: " + "  ".join(f"{k} {t * 1e3:7.2f}" for k, t in med.items()))
        out.append({"threads": threads, "tokens": tokens, "hdim": hdim, "fdim": fdim,
                    "ms": {k: t * 1e3 for k, t in med.items()}})
    return out


def moe(reps: int) -> list[dict]:
    from hetrun.kernels.moe_dispatch import (
        gate_topk_permute,
        gate_topk_permute_reference,
        unpermute_combine,
        unpermute_combine_reference,
    )

    torch.set_num_threads(1)
    print("\nMoE gate + top-k + permute, expert, weighted combine; forward + backward, 1 thread (median ms)")
    out = []
    for tokens, hdim, experts, k in ((4096, 128, 16, 2), (2048, 256, 8, 2)):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(tokens, hdim, generator=g, requires_grad=True)
        gw = torch.randn(experts, hdim, generator=g, requires_grad=True)
        ew = (torch.randn(hdim, hdim, generator=g) * hdim**-0.5).requires_grad_()
        gy = torch.randn(tokens, hdim, generator=g)

        def step(dispatch, combine, x=x, gw=gw, ew=ew, gy=gy, k=k, tokens=tokens):
            def run() -> None:
                d = dispatch(x, gw, k)
                y = torch.relu(d.permuted_x @ ew)
                combine(y, d.token_index, d.weights, tokens).backward(gy)
            return run

        med = _bench({"reference": step(gate_topk_permute_reference, unpermute_combine_reference),
                      "fused": step(gate_topk_permute, unpermute_combine)}, reps)
        print(f"  T={tokens} H={hdim} E={experts} k={k}: reference {med['reference'] * 1e3:7.2f}  "
              f"fused {med['fused'] * 1e3:7.2f}  speedup {med['reference'] / med['fused']:.2f}x")
        out.append({"tokens": tokens, "hdim": hdim, "experts": experts, "k": k,
                    "ms": {n: v * 1e3 for n, v in med.items()}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--quick", action="store_true", help="MoE shapes only, no transformer shapes")
    ap.add_argument("--json", default=str(Path(__file__).with_name("results") / "kernels_fused.json"))
    args = ap.parse_args()
    shapes = MOE_SHAPES if args.quick else MOE_SHAPES + TRANSFORMER_SHAPES
    results: dict[str, object] = {"ln_linear_gelu": []}
    for threads in (int(t) for t in args.threads.split(",")):
        print(f"LayerNorm + Linear + GELU, fp32, {threads} thread(s), median ms over {args.reps} rounds")
        results["ln_linear_gelu"] += ln_linear(shapes, threads, args.reps, args.compile)  # type: ignore[operator]
    results["components"] = [r for t in args.threads.split(",") for r in components(int(t), args.reps)]
    results["moe_routing"] = moe(args.reps)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

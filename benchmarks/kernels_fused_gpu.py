"""GPU benchmark: LayerNorm + Linear (+ GELU), Triton forward vs the ATen Function vs eager.

Variants, timed interleaved in one run (CUDA events, medians of --reps):

- ``eager``: ``gelu(linear(layer_norm(x)))`` as three ATen ops;
- ``aten_fn``: the fused autograd Function with cuBLAS/ATen inside
  (``triton_fused.disabled()``);
- ``triton``: ``ln_linear_gelu`` on CUDA, i.e. the Triton forward
  (row-stats kernel + GEMM with LN prologue / bias+GELU epilogue) and the ATen backward.

Then the MoE permute + weighted combine (routing, forward and backward),
Triton kernels vs the ATen Functions of ``kernels/moe_dispatch.py``.

Each in inference (``no_grad``) and training (forward + backward), fp32 with
TF32 off (the 1e-6 regime; Triton uses ``input_precision="ieee"``) and bf16.
The max relative error of each variant's forward against an fp64 eager
forward is printed beside its time. Without a CUDA GPU it says so and exits 0.

    python benchmarks/kernels_fused_gpu.py                 # all shapes, fp32 and bf16
    python benchmarks/kernels_fused_gpu.py --reps 50 --shapes 8192x1024x4096

Writes benchmarks/results/kernels_fused_gpu.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

DEFAULT_SHAPES = "4096x768x3072,8192x1024x4096,16384x2048x8192,2048x4096x1024"


def _timer(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def bench_shape(t: int, h: int, f: int, dtype: torch.dtype, reps: int) -> list[dict[str, object]]:
    from hetrun.kernels import triton_fused
    from hetrun.kernels.fused_ln_linear import ln_linear_gelu, ln_linear_gelu_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, h, device="cuda", generator=g).to(dtype)
    lnw = (1 + 0.2 * torch.randn(h, device="cuda", generator=g)).to(dtype)
    lnb = torch.randn(h, device="cuda", generator=g).to(dtype)
    w = (torch.randn(f, h, device="cuda", generator=g) * h**-0.5).to(dtype)
    b = torch.randn(f, device="cuda", generator=g).to(dtype)
    params = [p.requires_grad_(True) for p in (x, lnw, lnb, w, b)]
    gy = torch.randn(t, f, device="cuda", generator=g).to(dtype)
    exact = ln_linear_gelu_reference(*(p.detach().double() for p in params))

    def aten_fn() -> torch.Tensor:
        with triton_fused.disabled():
            return ln_linear_gelu(*params)

    variants: dict[str, Callable[[], torch.Tensor]] = {
        "eager": lambda: ln_linear_gelu_reference(*params),
        "aten_fn": aten_fn,
        "triton": lambda: ln_linear_gelu(*params),
    }
    rows = []
    errors = {}
    for name, fn in variants.items():  # warm-up (and Triton autotune) outside the timing
        with torch.no_grad():
            errors[name] = _rel(fn(), exact)
        fn().backward(gy)
    torch.cuda.synchronize()
    for mode in ("inference", "training"):
        times: dict[str, list[float]] = {n: [] for n in variants}
        for _ in range(reps):
            for name, fn in variants.items():  # interleaved: clock and thermal drift hit all alike
                if mode == "inference":
                    with torch.no_grad():
                        times[name].append(_timer(fn))
                else:
                    times[name].append(_timer(lambda fn=fn: fn().backward(gy)))
        eager_ms = statistics.median(times["eager"])
        for name in variants:
            ms = statistics.median(times[name])
            rows.append({
                "shape": f"{t}x{h}x{f}", "dtype": str(dtype).removeprefix("torch."), "mode": mode,
                "variant": name, "ms": ms, "speedup_vs_eager": eager_ms / ms, "fwd_rel_err": errors[name],
            })
    return rows


def bench_moe(tokens: int, hdim: int, experts: int, k: int, reps: int) -> list[dict[str, object]]:
    """Permute + expert stand-in + weighted combine, forward + backward: Triton vs the ATen Functions."""
    from hetrun.kernels import triton_fused
    from hetrun.kernels.moe_dispatch import gate_topk_permute, unpermute_combine

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(tokens, hdim, device="cuda", generator=g, requires_grad=True)
    gate = torch.randn(experts, hdim, device="cuda", generator=g)
    go = torch.randn(tokens, hdim, device="cuda", generator=g)

    def step() -> torch.Tensor:
        d = gate_topk_permute(x, gate, k)
        out = unpermute_combine(d.permuted_x * 2.0, d.token_index, d.weights, tokens)
        out.backward(go)
        return out

    def aten() -> torch.Tensor:
        with triton_fused.disabled():
            return step()

    variants = {"aten_fn": aten, "triton": step}
    outs = {n: fn().detach() for n, fn in variants.items()}
    err = _rel(outs["triton"], outs["aten_fn"])
    times: dict[str, list[float]] = {n: [] for n in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(_timer(fn))
    base = statistics.median(times["aten_fn"])
    return [
        {"shape": f"{tokens}x{hdim} E={experts} k={k}", "variant": n, "ms": statistics.median(t),
         "speedup_vs_aten_fn": base / statistics.median(t), "rel_err_vs_aten_fn": err}
        for n, t in times.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="TxHxF,... (tokens x in x out features)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--moe", default="16384x1024x8x2,65536x2048x64x2", help="TxHxExK,... ('' skips)")
    ap.add_argument("--json", default=str(Path(__file__).with_name("results") / "kernels_fused_gpu.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("kernels_fused_gpu: no CUDA GPU here; nothing measured (run it where one is)")
        return
    from hetrun.kernels import triton_fused

    if not triton_fused.available():
        print("kernels_fused_gpu: triton is not installed (pip install triton); nothing measured")
        return
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the 1e-6 regime on every side
    try:
        rows = []
        for dtype_name in args.dtypes.split(","):
            for shape in args.shapes.split(","):
                t, h, f = (int(v) for v in shape.split("x"))
                rows += bench_shape(t, h, f, getattr(torch, dtype_name), args.reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    print(f"device: {torch.cuda.get_device_name()}  reps: {args.reps} (medians)")
    print(f"{'shape TxHxF':>18} {'dtype':>9} {'mode':>10} {'variant':>8} {'ms':>9} {'x eager':>8} {'fwd err':>9}")
    for r in rows:
        print(
            f"{r['shape']:>18} {r['dtype']:>9} {r['mode']:>10} {r['variant']:>8} {r['ms']:>9.3f} "
            f"{r['speedup_vs_eager']:>8.2f} {r['fwd_rel_err']:>9.1e}"
        )
    moe_rows = [r for shape in args.moe.split(",") if shape for r in bench_moe(*(int(v) for v in shape.split("x")), args.reps)]
    print(f"\nMoE permute + combine, fwd+bwd (routing included)\n{'shape':>26} {'variant':>8} {'ms':>9} {'x aten':>7} {'rel err':>9}")
    for r in moe_rows:
        print(f"{r['shape']:>26} {r['variant']:>8} {r['ms']:>9.3f} {r['speedup_vs_aten_fn']:>7.2f} {r['rel_err_vs_aten_fn']:>9.1e}")
    out = {"device": torch.cuda.get_device_name(), "reps": args.reps, "ln_linear_gelu": rows, "moe": moe_rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

"""Triton kernels for the fused ops: LayerNorm + Linear (+ GELU), and the MoE permute / combine.

LayerNorm + Linear (+ GELU) forward: row statistics, then one GEMM with LN in its prologue.

Two kernels per call:

- ``_row_stats_kernel``: one program per row, two passes over H (mean, then
  the centred sum of squares, so large offsets do not cancel), writes the
  fp32 ``mean`` and ``rstd`` that the GEMM and the backward use;
- ``_ln_linear_kernel``: a blocked [T, H] x [H, F] GEMM whose prologue
  normalises each x tile on load with the row stats and applies gamma/beta
  there (not folded into W as the CPU path does: on a GPU the fold would be an
  extra F x H pass per call and a rounding step the reference does not take),
  and whose epilogue adds the bias and applies GELU (exact erf, or tanh),
  storing the pre-activation ``h`` too when the backward needs it.

Precision: fp32 accumulation always. For fp32 inputs the dot runs with
``input_precision="ieee"`` (no TF32) so the forward stays within 1e-6 of the
eager fp32 reference; the rounding of mean/rstd and of the division use the
IEEE round-to-nearest ops (``sqrt_rn``, ``div_rn``), not the fast approximations.
bf16/fp16 inputs: the normalised tile is rounded to the input dtype before
the dot (as eager's layer_norm output is), W stays in its dtype, results are
stored in the input dtype.

Backward runs ATen on the saved tensors (documented choice: it is three
GEMMs plus pointwise work that cuBLAS and ATen's layer_norm backward already
do well): it recomputes the LN output from ``x``, ``mean``, ``rstd`` rather
than keeping a T x H copy, uses ``gelu_backward`` on the saved ``h`` and
``native_layer_norm_backward`` for the x / gamma / beta gradients.

MoE (the Functions of ``kernels/moe_dispatch.py`` on CUDA): the permutation
is a row gather (its backward, and the weighted combine, a segmented sum over
each token's rows found by a stable sort of ``token_index``: no atomics, so
deterministic and, in fp32, bit-identical to the sequential ``index_add``);
the combine backward reads each output-gradient row once for both the
expert-output and the gate-weight gradients. ``token_index`` must hold valid
rows (it comes from the router; it is not range-checked on the device).

Runs on a CUDA GPU, or on the CPU under the Triton interpreter
(``TRITON_INTERPRET=1``, how the tests check it here). :func:`available`
says whether it can run; ``kernels/fused_ln_linear.py`` sends CUDA fp32 /
bf16 / fp16 tensors here when it is true.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from hetrun.errors import HetrunError

try:  # Triton is an optional GPU dependency
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = [
    "available", "combine_rows_triton", "disabled", "ln_linear_gelu_triton", "moe_supports", "permute_rows_triton",
    "supports",
]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_enabled = True


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Keep ``ln_linear_gelu`` off the Triton path for a block (benchmarks compare it with ATen)."""
    global _enabled
    old, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = old


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    """Triton importable and something to run it on (a GPU, or the CPU interpreter)."""
    if triton is None:
        return False
    return torch.cuda.is_available() or _interpreting()


def supports(x: torch.Tensor, weight: torch.Tensor, approximate: str) -> bool:
    """Whether ``ln_linear_gelu`` should send these tensors here (CUDA, or CPU when interpreting)."""
    return _enabled and _takes(x, weight, approximate)


def _takes(x: torch.Tensor, weight: torch.Tensor, approximate: str) -> bool:
    on_device = x.is_cuda or (_interpreting() and x.device.type == "cpu")
    return (
        available()
        and on_device
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and approximate in ("none", "tanh")
    )


if triton is not None:

    # H == 1 would otherwise be specialised to a Python constant (no ``.to``)
    @triton.jit(do_not_specialize=["H"])
    def _row_stats_kernel(x_ptr, mean_ptr, rstd_ptr, H, eps, BLOCK_H: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * H
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            offs = start + tl.arange(0, BLOCK_H)
            acc += tl.load(base + offs, mask=offs < H, other=0.0).to(tl.float32)
        mean = tl.div_rn(tl.sum(acc, axis=0), H.to(tl.float32))
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            offs = start + tl.arange(0, BLOCK_H)
            mask = offs < H
            d = tl.where(mask, tl.load(base + offs, mask=mask, other=0.0).to(tl.float32) - mean, 0.0)
            acc += d * d
        var = tl.div_rn(tl.sum(acc, axis=0), H.to(tl.float32))
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, tl.div_rn(1.0, tl.sqrt_rn(var + eps)))

    @triton.jit
    def _gelu(h, APPROX_TANH: tl.constexpr):
        if APPROX_TANH:
            z = 0.7978845608028654 * (h + 0.044715 * h * h * h)
            # tanh(z) = 1 - 2 / (1 + exp(2z)), written so large |z| saturates without inf/inf
            t = 1.0 - tl.div_rn(2.0, 1.0 + tl.exp(2.0 * z))
            return 0.5 * h * (1.0 + t)
        return 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))

    @triton.jit
    # A Triton kernel is one function by construction (the fused LayerNorm + linear + GELU).
    def _ln_linear_kernel(
        x_ptr, mean_ptr, rstd_ptr, lnw_ptr, lnb_ptr, w_ptr, bias_ptr, y_ptr, h_ptr,
        T, F, H,
        HAS_LNW: tl.constexpr, HAS_LNB: tl.constexpr, HAS_BIAS: tl.constexpr,
        GELU: tl.constexpr, APPROX_TANH: tl.constexpr, STORE_H: tl.constexpr,
        IEEE: tl.constexpr, UPCAST_DOT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):
        # Grouped program order: GROUP_M row blocks share their W column blocks in L2.
        pid = tl.program_id(0)
        n_m = tl.cdiv(T, BLOCK_M)
        n_n = tl.cdiv(F, BLOCK_N)
        per_group = GROUP_M * n_n
        first_m = (pid // per_group) * GROUP_M
        group_rows = tl.minimum(n_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % group_rows
        pid_n = (pid % per_group) // group_rows

        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < T
        col_ok = cols < F
        rows64 = rows.to(tl.int64)
        cols64 = cols.to(tl.int64)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            tile_ok = row_ok[:, None] & k_ok[None, :]
            x = tl.load(x_ptr + rows64[:, None] * H + ks[None, :], mask=tile_ok, other=0.0)
            # prologue: LayerNorm on load, in fp32 (same op order as the eager kernel)
            xn = (x.to(tl.float32) - mean[:, None]) * rstd[:, None]
            if HAS_LNW:
                xn = xn * tl.load(lnw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            if HAS_LNB:
                xn = xn + tl.load(lnb_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            # padding lanes normalise to -mean*rstd (+beta): zero them so they add nothing
            xn = tl.where(tile_ok, xn, 0.0)
            wt = tl.load(
                w_ptr + cols64[None, :] * H + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0
            )  # [BLOCK_K, BLOCK_N] = W^T tile
            if IEEE:
                acc = tl.dot(xn, wt.to(tl.float32), acc, input_precision="ieee")
            elif UPCAST_DOT:
                # Triton 3.9's interpreter computes bf16 dots wrongly (numpy has no bf16):
                # the same rounded operands in an fp32 dot give the same products
                acc = tl.dot(xn.to(wt.dtype).to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(xn.to(wt.dtype), wt, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out_ok = row_ok[:, None] & col_ok[None, :]
        offs = rows64[:, None] * F + cols64[None, :]
        if GELU:
            if STORE_H:
                tl.store(h_ptr + offs, acc.to(h_ptr.dtype.element_ty), mask=out_ok)
            if IEEE:
                y = _gelu(acc, APPROX_TANH)
            else:
                # eager rounds h to the input dtype before its GELU: do the same
                y = _gelu(acc.to(y_ptr.dtype.element_ty).to(tl.float32), APPROX_TANH)
        else:
            y = acc
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=out_ok)

    # Small, sane autotune set for GPUs (keyed on the shape); the interpreter uses one fixed config.
    _ln_linear_autotuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=4),
            triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=4),
            triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3),
            triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=2, num_stages=4),
        ],
        key=["T", "F", "H", "IEEE", "UPCAST_DOT"],
    )(_ln_linear_kernel)


def _require(x: torch.Tensor, weight: torch.Tensor, approximate: str) -> None:
    if triton is None:
        raise HetrunError(
            "ln_linear_gelu_triton: triton is not installed", hint="pip install triton, or use ln_linear_gelu"
        )
    if not _takes(x, weight, approximate):
        raise HetrunError(
            f"ln_linear_gelu_triton: unsupported input (device={x.device}, dtype={x.dtype}, "
            f"weight dtype={weight.dtype}, approximate={approximate!r})",
            hint="needs CUDA tensors (or CPU with TRITON_INTERPRET=1) of one dtype among fp32/bf16/fp16 "
            "and approximate 'none' or 'tanh'; ln_linear_gelu picks the right path itself",
        )


def _forward(
    x2d: torch.Tensor, ln_w: torch.Tensor | None, ln_b: torch.Tensor | None, w: torch.Tensor,
    bias: torch.Tensor | None, eps: float, gelu: bool, approximate: str, store_h: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    rows, hdim = x2d.shape
    fdim = w.shape[0]
    w = w.contiguous()
    mean = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    rstd = torch.empty_like(mean)
    y = torch.empty(rows, fdim, dtype=x2d.dtype, device=x2d.device)
    h = torch.empty_like(y) if gelu and store_h else None
    if rows == 0 or fdim == 0:
        return y, h, mean, rstd
    if hdim == 0:
        raise HetrunError("ln_linear_gelu_triton: the normalised dimension H is 0", hint="give x at least one feature")
    block_h = min(triton.next_power_of_2(hdim), 4096 if not _interpreting() else 256)
    _row_stats_kernel[(rows,)](x2d, mean, rstd, hdim, float(eps), BLOCK_H=block_h)
    dummy = mean  # never read: the HAS_* flags are false where it is passed
    args = (
        x2d, mean, rstd,
        ln_w.contiguous() if ln_w is not None else dummy,
        ln_b.contiguous() if ln_b is not None else dummy,
        w,
        bias.contiguous() if bias is not None else dummy,
        y, h if h is not None else y,
        rows, fdim, hdim,
    )
    flags = {
        "HAS_LNW": ln_w is not None, "HAS_LNB": ln_b is not None, "HAS_BIAS": bias is not None,
        "GELU": gelu, "APPROX_TANH": approximate == "tanh", "STORE_H": h is not None,
        "IEEE": x2d.dtype == torch.float32,
        "UPCAST_DOT": _interpreting() and x2d.dtype == torch.bfloat16,
    }
    if _interpreting():
        # tl.dot needs every block dimension >= 16; one config keeps the interpreter quick
        bm, bn, bk = 16, 16, 16
        grid = (triton.cdiv(rows, bm) * triton.cdiv(fdim, bn),)
        _ln_linear_kernel[grid](*args, **flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2)
    else:
        def grid(meta: dict[str, Any]) -> tuple[int]:
            return (triton.cdiv(rows, meta["BLOCK_M"]) * triton.cdiv(fdim, meta["BLOCK_N"]),)

        _ln_linear_autotuned[grid](*args, **flags)
    return y, h, mean, rstd


class _TritonLNLinearGELU(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x2d: torch.Tensor, ln_w: torch.Tensor | None, ln_b: torch.Tensor | None,
        w: torch.Tensor, bias: torch.Tensor | None, eps: float, gelu: bool, approximate: str,
    ) -> torch.Tensor:
        training = any(ctx.needs_input_grad[:5])
        y, h, mean, rstd = _forward(x2d, ln_w, ln_b, w, bias, eps, gelu, approximate, store_h=training)
        if training:
            ctx.save_for_backward(x2d, mean, rstd, ln_w, ln_b, w, h)
            ctx.gelu, ctx.approximate, ctx.has_bias = gelu, approximate, bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        # ATen on the saved tensors (see the module docstring).
        x2d, mean, rstd, ln_w, ln_b, w, h = ctx.saved_tensors
        need_x, need_lnw, need_lnb, need_w, need_b = ctx.needs_input_grad[:5]
        gy = gy.contiguous()
        gh = torch.ops.aten.gelu_backward(gy, h, approximate=ctx.approximate) if ctx.gelu else gy
        gx = g_lnw = g_lnb = gw = gb = None
        if need_w:
            # recompute the LN output (x - mean) * rstd * gamma + beta instead of saving T x H
            xn = (x2d.float() - mean[:, None]) * rstd[:, None]
            if ln_w is not None:
                xn = xn * ln_w.float()
            if ln_b is not None:
                xn = xn + ln_b.float()
            gw = gh.t() @ xn.to(x2d.dtype)
        if need_b and ctx.has_bias:
            gb = gh.sum(0)
        if need_x or need_lnw or need_lnb:
            gxn = gh @ w
            mask = [need_x, need_lnw and ln_w is not None, need_lnb and ln_b is not None]
            gx, g_lnw, g_lnb = torch.ops.aten.native_layer_norm_backward(
                gxn, x2d, (x2d.shape[1],), mean.to(x2d.dtype) if x2d.device.type == "cpu" else mean,
                rstd.to(x2d.dtype) if x2d.device.type == "cpu" else rstd, ln_w, ln_b, mask,
            )
        return gx, g_lnw, g_lnb, gw, gb, None, None, None


def ln_linear_gelu_triton(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    eps: float = 1e-5,
    gelu: bool = True,
    approximate: str = "none",
) -> torch.Tensor:
    """``gelu(linear(layer_norm(x), weight, bias))`` with the Triton forward; ``x`` [..., H] -> [..., F]."""
    _require(x, weight, approximate)
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    leaves = (x, ln_weight, ln_bias, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in leaves):
        y = _TritonLNLinearGELU.apply(x2d, ln_weight, ln_bias, weight, bias, eps, gelu, approximate)
    else:
        # no graph: no Function (its needs_input_grad stays True under no_grad), no h kept
        y = _forward(x2d, ln_weight, ln_bias, weight, bias, eps, gelu, approximate, store_h=False)[0]
    return y.reshape(*lead, weight.shape[0])


# --- MoE token permutation (row gather) and weighted combine (segmented sum) -------------------
#
# The combine is a scatter-add by token. Instead of atomics (order-dependent
# fp32 sums, run to run) each token's rows are found through a stable sort of
# ``token_index`` (ATen) and summed in one program in their original order:
# deterministic, and bit-identical to the sequential fp32 ``index_add``.

if triton is not None:

    @triton.jit
    def _gather_rows_kernel(src_ptr, index_ptr, out_ptr, H, BLOCK_H: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        ok = cols < H
        src = tl.load(index_ptr + row).to(tl.int64)
        tl.store(out_ptr + row * H + cols, tl.load(src_ptr + src * H + cols, mask=ok), mask=ok)

    @triton.jit
    def _segment_sum_kernel(
        rows_ptr, w_ptr, order_ptr, starts_ptr, out_ptr, H, HAS_W: tl.constexpr, BLOCK_H: tl.constexpr,
    ):
        # out[t] = sum over the rows j of token t, in ascending j, of w[j] * rows[j]
        tok = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        ok = cols < H
        start = tl.load(starts_ptr + tok)
        end = tl.load(starts_ptr + tok + 1)
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for s in range(start, end):
            j = tl.load(order_ptr + s).to(tl.int64)
            r = tl.load(rows_ptr + j * H + cols, mask=ok, other=0.0).to(tl.float32)
            if HAS_W:
                r = r * tl.load(w_ptr + j).to(tl.float32)
            acc += r
        tl.store(out_ptr + tok * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _combine_backward_kernel(
        g_ptr, y_ptr, w_ptr, index_ptr, gy_ptr, gw_ptr, H, NEED_GY: tl.constexpr, NEED_GW: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        # one program per permuted row j: g[token_index[j]] is read once for both gradients
        row = tl.program_id(0).to(tl.int64)
        tok = tl.load(index_ptr + row).to(tl.int64)
        w = tl.load(w_ptr + row).to(tl.float32)
        dot = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for c0 in range(0, H, BLOCK_H):
            cols = c0 + tl.arange(0, BLOCK_H)
            ok = cols < H
            g = tl.load(g_ptr + tok * H + cols, mask=ok, other=0.0).to(tl.float32)
            if NEED_GY:
                tl.store(gy_ptr + row * H + cols, (g * w).to(gy_ptr.dtype.element_ty), mask=ok)
            if NEED_GW:
                dot += g * tl.load(y_ptr + row * H + cols, mask=ok, other=0.0).to(tl.float32)
        if NEED_GW:
            tl.store(gw_ptr + row, tl.sum(dot, axis=0).to(gw_ptr.dtype.element_ty))


def _block_h(hdim: int) -> int:
    return max(16, min(triton.next_power_of_2(hdim), 128 if _interpreting() else 1024))


def _gather_rows(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    out = torch.empty((index.shape[0], src.shape[1]), dtype=src.dtype, device=src.device)
    if out.numel():
        bh = _block_h(src.shape[1])
        _gather_rows_kernel[(index.shape[0], triton.cdiv(src.shape[1], bh))](src, index, out, src.shape[1], BLOCK_H=bh)
    return out


def _segments(index: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of each token in ascending row order, and where each token's run starts (ATen)."""
    order = torch.sort(index, stable=True).indices
    starts = torch.zeros(num_tokens + 1, dtype=torch.int64, device=index.device)
    torch.cumsum(torch.bincount(index, minlength=num_tokens), 0, out=starts[1:])
    return order, starts


def _segment_sum(
    rows: torch.Tensor, weights: torch.Tensor | None, index: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    out = torch.empty((num_tokens, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    if out.numel():
        order, starts = _segments(index, num_tokens)
        bh = _block_h(rows.shape[1])
        _segment_sum_kernel[(num_tokens, triton.cdiv(rows.shape[1], bh))](
            rows, weights if weights is not None else rows, order, starts, out, rows.shape[1],
            HAS_W=weights is not None, BLOCK_H=bh,
        )
    return out


class _TritonPermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(token_index)
        ctx.rows = x.shape[0]
        return _gather_rows(x, token_index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (token_index,) = ctx.saved_tensors
        return _segment_sum(g.contiguous(), None, token_index, ctx.rows), None


class _TritonCombine(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, y: torch.Tensor, token_index: torch.Tensor, w: torch.Tensor, num_tokens: int
    ) -> torch.Tensor:
        ctx.save_for_backward(y, token_index, w)
        return _segment_sum(y, w, token_index, num_tokens)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        y, token_index, w = ctx.saved_tensors
        need_gy, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        gy = torch.empty_like(y) if need_gy else None
        gw = torch.empty_like(w) if need_gw else None
        if y.shape[0] and (need_gy or need_gw):
            _combine_backward_kernel[(y.shape[0],)](
                g.contiguous(), y, w, token_index, gy if gy is not None else y, gw if gw is not None else w,
                y.shape[1], NEED_GY=need_gy, NEED_GW=need_gw, BLOCK_H=_block_h(y.shape[1]),
            )
        return gy, None, gw, None


def moe_supports(x: torch.Tensor) -> bool:
    """Whether the MoE permute/combine should run here: 2-D fp32/bf16/fp16 rows on CUDA (or interpreting)."""
    on_device = x.is_cuda or (_interpreting() and x.device.type == "cpu")
    return _enabled and available() and on_device and x.dim() == 2 and x.dtype in _DTYPES


def _require_moe(x: torch.Tensor, token_index: torch.Tensor, what: str) -> None:
    if triton is None:
        raise HetrunError(f"{what}: triton is not installed", hint="pip install triton, or use kernels.moe_dispatch")
    on_device = x.is_cuda or (_interpreting() and x.device.type == "cpu")
    if not (available() and on_device and x.dim() == 2 and x.dtype in _DTYPES):
        raise HetrunError(
            f"{what}: unsupported rows (device={x.device}, dtype={x.dtype}, dims={x.dim()})",
            hint="needs 2-D fp32/bf16/fp16 CUDA tensors (or CPU with TRITON_INTERPRET=1)",
        )
    if token_index.dtype not in (torch.int32, torch.int64):
        raise HetrunError(f"{what}: token_index has dtype {token_index.dtype}", hint="pass int64 (or int32) indices")


def permute_rows_triton(x: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
    """``x[token_index]`` [T*k, H] with a Triton gather (backward: deterministic segmented sum)."""
    _require_moe(x, token_index, "permute_rows_triton")
    return _TritonPermute.apply(x.contiguous(), token_index.contiguous())


def combine_rows_triton(
    y: torch.Tensor, token_index: torch.Tensor, weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """``out[t] = sum of weights[j] * y[j]`` over rows ``j`` of token ``t``, without atomics."""
    _require_moe(y, token_index, "combine_rows_triton")
    return _TritonCombine.apply(y.contiguous(), token_index.contiguous(), weights.contiguous(), num_tokens)

"""LayerNorm + Linear (+ GELU) as one autograd Function with a hand-written backward.

Reference (unfused): ``gelu(linear(layer_norm(x, (H,), g, b), W, bias))``.

What the fusion saves on CPU:

- the LayerNorm affine is folded into the Linear: ``W' = W * g`` and
  ``b' = bias + W @ b`` (F x H work, not T x H), so the normalised rows go
  straight into one ``addmm`` and no affine output is written or read back;
- the backward reuses the saved pre-activation and normalised rows, computes
  the LayerNorm input gradient with the single-pass ATen kernel and folds the
  gamma/beta gradients into F x H products instead of T x H passes;
- whole-tensor calls, not row blocks: blocking (tried in the previous version)
  gained nothing measurable at 1 thread and, with 2 threads, every block's
  parallel region was a sync point (2-3x slower than eager on the loaded machine);
- CPU fp32 paths, chosen automatically (each switchable with :func:`cpu_paths`
  so benchmarks and tests compare them): GELU forward, and GELU backward fused
  with the bias-gradient column sum, in C (``kernels/fused_native.py``: one
  inline exp per element serves erf and the pdf; ~2x ATen's gelu_backward +
  sum); the input-gradient GEMM in oneDNN (faster than MKL for [T, F] x [F, H]
  here); the forward GEMM in oneDNN, bias in its epilogue, for H <= 128 only
  (bit-identical to MKL there; at larger H its summation order costs most of
  the 1e-6 forward budget); without autograd GELU overwrites the
  pre-activation in place. CUDA tensors go to the Triton forward
  (``kernels/triton_fused.py``, ATen backward); other devices and dtypes take
  the ATen ops through the same Function.

The three GEMMs are the floor: on one core they are ~70-85% of the eager
time, so no fusion of the rest can be much more than ~1.2-1.4x faster than
eager (``benchmarks/kernels_fused.py`` prints that floor beside every variant).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from hetrun.errors import HetrunError

__all__ = ["CpuPaths", "FusedLayerNormLinear", "cpu_paths", "ln_linear_gelu", "ln_linear_gelu_reference"]



_scratch = threading.local()


@dataclasses.dataclass(frozen=True)
class CpuPaths:
    """Which CPU fp32 fast paths the fused op may take (each falls back to ATen when unavailable)."""

    native_gelu_backward: bool = True  # C: GELU backward + bias-gradient sum in one pass
    native_gelu_forward: bool = True  # C: GELU forward (ATen's erf formula, one inline exp)
    onednn_grad_input: bool = True  # oneDNN for the [T, F] x [F, H] input-gradient GEMM
    # oneDNN for the forward GEMM (bias in its epilogue, no broadcast pass) when
    # H <= this. Measured here: for K = H <= 128 its result is bit-identical to
    # MKL's (eager's); for H >= 256 its summation order differs and the forward
    # moves 8-9e-7 from eager's, against the 1e-6 budget. 0 turns it off.
    onednn_forward_max_h: int = 128
    # The C GELU kernels split rows over torch's threads, but with 2+ threads
    # ATen's parallel GELU was faster here (benchmarks/kernels_fused.py,
    # "Components alone, 2 threads"): C only up to this many intra-op threads.
    native_max_threads: int = 1


_paths = CpuPaths()


@contextlib.contextmanager
def cpu_paths(**overrides: bool | int) -> Iterator[CpuPaths]:
    """Switch CPU paths for a block (benchmarks and tests compare them side by side)."""
    global _paths
    old = _paths
    known = {f.name for f in dataclasses.fields(CpuPaths)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise HetrunError(
            f"cpu_paths: unknown CPU path(s) {unknown}", hint=f"use some of {sorted(known)}"
        )
    _paths = dataclasses.replace(old, **overrides)  # type: ignore[arg-type]  # fields are bool or int
    try:
        yield _paths
    finally:
        _paths = old


def _onednn_ok(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def _native_gelu_ok(t: torch.Tensor, approximate: str) -> bool:
    if approximate != "none" or t.device.type != "cpu" or t.dtype != torch.float32:
        return False
    if torch.get_num_threads() > _paths.native_max_threads:
        return False
    from hetrun.kernels.fused_native import lib

    return lib() is not None


def _workspace(like: torch.Tensor) -> torch.Tensor:
    """A per-thread scratch tensor shaped like ``like``, reused across calls.

    The GELU gradient lives only inside backward; a fresh T x F buffer per
    call costs more in first-touch page faults than the GELU itself.
    """
    key = (tuple(like.shape), like.dtype, like.device)
    buf = getattr(_scratch, "buf", None)
    if buf is None or getattr(_scratch, "key", None) != key:
        buf = torch.empty_like(like)
        _scratch.buf, _scratch.key = buf, key
    return buf


def _gelu_into(h: torch.Tensor, y: torch.Tensor, approximate: str, native: bool) -> None:
    """``y = gelu(h)``; ``y`` may be ``h``."""
    if native:
        from hetrun.kernels.fused_native import gelu_forward

        gelu_forward(h, y)
    else:
        torch.ops.aten.gelu.out(h, approximate=approximate, out=y)


def ln_linear_gelu_reference(
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
    """The unfused eager composition the fused op is proven equal to."""
    h = F.linear(F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps), weight, bias)
    return F.gelu(h, approximate=approximate) if gelu else h


class _LNLinearGELU(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x2d: torch.Tensor,
        ln_w: torch.Tensor | None,
        ln_b: torch.Tensor | None,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        eps: float,
        gelu: bool,
        approximate: str,
        grad_enabled: bool,
    ) -> torch.Tensor:
        hdim = x2d.shape[1]
        xhat, mean, rstd = torch.native_layer_norm(x2d, (hdim,), None, None, eps)
        w_f = w * ln_w if ln_w is not None else w  # [F, H]
        b_f = bias if bias is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
        if ln_b is not None:
            b_f = torch.addmv(b_f, w, ln_b)
        rows = x2d.shape[0]
        # Backward needs h; without autograd GELU overwrites it (no second T x F tensor).
        # (needs_input_grad stays True under no_grad when the weights require grad)
        training = grad_enabled and any(ctx.needs_input_grad[:5])
        native = gelu and _paths.native_gelu_forward and _native_gelu_ok(x2d, approximate)
        if rows and hdim <= _paths.onednn_forward_max_h and _onednn_ok(x2d):
            # One oneDNN call with the bias in its epilogue (addmm first broadcasts the
            # bias over the output), then GELU over the whole pre-activation.
            h = torch.ops.mkldnn._linear_pointwise(xhat, w_f.contiguous(), b_f, "none", [], "")
            y = h if not gelu else torch.empty_like(h) if training else h
            if gelu:
                _gelu_into(h, y, approximate, native)
        else:
            h = torch.empty(rows, w.shape[0], dtype=x2d.dtype, device=x2d.device)
            y = torch.empty_like(h) if gelu and training else h
            torch.addmm(b_f, xhat, w_f.t(), out=h)
            if gelu:
                _gelu_into(h, y, approximate, native)
        if not training:
            return y
        ctx.save_for_backward(x2d, xhat, mean, rstd, w, w_f, ln_w, ln_b, h if gelu else None)
        ctx.gelu, ctx.approximate, ctx.has_bias = gelu, approximate, bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x2d, xhat, mean, rstd, w, w_f, ln_w, ln_b, h = ctx.saved_tensors
        need_x, need_lnw, need_lnb, need_w, need_b = ctx.needs_input_grad[:5]
        gy = gy.contiguous()
        need_wf = need_w or need_lnw
        gx = g_lnw = g_lnb = gw = gb = None
        paths = _paths
        gb_f = None
        if ctx.gelu and paths.native_gelu_backward and _native_gelu_ok(gy, ctx.approximate):
            from hetrun.kernels.fused_native import gelu_backward_bias

            gh = _workspace(gy)
            gb_f = gelu_backward_bias(gy, h, gh)
        elif ctx.gelu:
            gh = _workspace(gy)
            torch.ops.aten.gelu_backward.grad_input(gy, h, approximate=ctx.approximate, grad_input=gh)
        else:
            gh = gy
        if gb_f is None:
            gb_f = gh.sum(0)
        gxhat = None
        if need_x and paths.onednn_grad_input and _onednn_ok(gh):
            gxhat = torch.ops.mkldnn._linear_pointwise(gh, w_f.t().contiguous(), None, "none", [], "")
        elif need_x:
            gxhat = gh @ w_f  # [T, H]
        gw_f = gh.t() @ xhat if need_wf else None  # [F, H]
        if gxhat is not None:
            gx = torch.ops.aten.native_layer_norm_backward(
                gxhat, x2d, (x2d.shape[1],), mean, rstd, None, None, [True, False, False]
            )[0]
        if gw_f is not None:
            if need_lnw and ln_w is not None:
                g_lnw = (gw_f * w).sum(0)
            if need_w:
                gw = gw_f * ln_w if ln_w is not None else gw_f
                if ln_b is not None:
                    gw = gw.addr_(gb_f, ln_b)
        if need_lnb and ln_b is not None:
            g_lnb = w.t() @ gb_f
        if need_b and ctx.has_bias:
            gb = gb_f
        return gx, g_lnw, g_lnb, gw, gb, None, None, None, None


def ln_linear_gelu(
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
    """``gelu(linear(layer_norm(x), weight, bias))`` fused; ``x`` is [..., H], result [..., F]."""
    if x.is_cuda and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        # CUDA: the Triton forward (kernels/triton_fused.py) when Triton is installed
        from hetrun.kernels import triton_fused

        if triton_fused.supports(x, weight, approximate):
            return triton_fused.ln_linear_gelu_triton(
                x, ln_weight, ln_bias, weight, bias, eps=eps, gelu=gelu, approximate=approximate
            )
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    y = _LNLinearGELU.apply(x2d, ln_weight, ln_bias, weight, bias, eps, gelu, approximate,
                            torch.is_grad_enabled())
    return y.reshape(*lead, weight.shape[0])


class FusedLayerNormLinear(torch.nn.Module):
    """Drop-in module: LayerNorm(H) then Linear(H, F) then (optionally) GELU, fused."""

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool = True, gelu: bool = True,
        eps: float = 1e-5, approximate: str = "none",
    ) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(in_features, eps=eps)
        self.linear = torch.nn.Linear(in_features, out_features, bias=bias)
        self.gelu, self.eps, self.approximate = gelu, eps, approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ln_linear_gelu(
            x, self.norm.weight, self.norm.bias, self.linear.weight, self.linear.bias,
            eps=self.eps, gelu=self.gelu, approximate=self.approximate,
        )

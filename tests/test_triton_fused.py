"""Triton LayerNorm + Linear (+ GELU) against the eager reference: forward 1e-6, gradients 1e-4 (fp32).

On CPU through the Triton interpreter (``TRITON_INTERPRET=1``, set here before
triton is imported; shapes small and deliberately not multiples of the 16-wide
interpreter blocks); compiled on a GPU when one is present. Skipped explicitly
when Triton is not installed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from hetrun.kernels import triton_fused as tf
from hetrun.kernels.fused_ln_linear import ln_linear_gelu, ln_linear_gelu_reference
from setup_tools import TRITON, needs

from hetrun.errors import HetrunError

pytestmark = needs(tf.available(), TRITON)
DEVICE = "cuda" if torch.cuda.is_available() and os.environ["TRITON_INTERPRET"] != "1" else "cpu"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _leaves(t: int, h: int, f: int, seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g) * 2 + 0.5
    lnw = 1 + 0.2 * torch.randn(h, generator=g)
    lnb = torch.randn(h, generator=g)
    w = torch.randn(f, h, generator=g) * h**-0.5
    b = torch.randn(f, generator=g)
    return [p.to(DEVICE, dtype).requires_grad_(True) for p in (x, lnw, lnb, w, b)]


@pytest.fixture(autouse=True)
def _no_tf32():
    if DEVICE != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference in fp32, as on the CPU
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize(
    ("t", "h", "f", "gelu", "bias", "affine", "approximate"),
    [
        (37, 29, 45, True, True, True, "none"),
        (1, 8, 8, True, True, True, "none"),
        (50, 40, 33, False, True, True, "none"),
        (20, 16, 24, True, False, False, "none"),
        (33, 48, 17, True, True, True, "tanh"),
        (17, 300, 20, True, True, True, "none"),  # H > the row-stats block: its loop, and 19 K steps
    ],
)
def test_forward_and_gradients_match_eager(t, h, f, gelu, bias, affine, approximate) -> None:
    x, lnw, lnb, w, b = _leaves(t, h, f, seed=t * 1000 + h)
    lnw_, lnb_ = (lnw, lnb) if affine else (None, None)
    b_ = b if bias else None
    params = [p for p in (x, lnw_, lnb_, w, b_) if p is not None]
    kw = {"gelu": gelu, "approximate": approximate}
    y = tf.ln_linear_gelu_triton(x, lnw_, lnb_, w, b_, **kw)
    y_ref = ln_linear_gelu_reference(x, lnw_, lnb_, w, b_, **kw)
    assert y.shape == (t, f) and y.dtype == torch.float32
    assert _rel(y, y_ref) < 1e-6
    gy = torch.randn(t, f, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    grads = torch.autograd.grad(y, params, gy)
    grads_ref = torch.autograd.grad(y_ref, params, gy)
    for got, ref in zip(grads, grads_ref, strict=True):
        assert _rel(got, ref) < 1e-4


def test_partial_gradients_and_leading_dims() -> None:
    """Only x needs a gradient (weights frozen); a 3-D input keeps its leading shape."""
    x, lnw, lnb, w, b = _leaves(2 * 19, 24, 30, seed=3)
    frozen = [p.detach() for p in (lnw, lnb, w, b)]
    x3 = x.detach().reshape(2, 19, 24).requires_grad_(True)
    y = tf.ln_linear_gelu_triton(x3, *frozen)
    y_ref = ln_linear_gelu_reference(x3, *frozen)
    assert y.shape == (2, 19, 30) and _rel(y, y_ref) < 1e-6
    gy = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, [x3], gy)
    (gx_ref,) = torch.autograd.grad(y_ref, [x3], gy)
    assert _rel(gx, gx_ref) < 1e-4


def test_inference_keeps_no_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under no_grad (leaves that require grad included) no pre-activation is stored."""
    x, lnw, lnb, w, b = _leaves(21, 20, 18, seed=5)
    real, stored = tf._forward, []

    def _spy(*a: object, store_h: bool) -> tuple[torch.Tensor, ...]:
        stored.append(store_h)
        return real(*a, store_h=store_h)

    monkeypatch.setattr(tf, "_forward", _spy)
    with torch.no_grad():
        y = tf.ln_linear_gelu_triton(x, lnw, lnb, w, b)
    assert not y.requires_grad and stored == [False]
    assert _rel(y, ln_linear_gelu_reference(x, lnw, lnb, w, b)) < 1e-6


def test_row_stats_are_stable_under_a_large_offset() -> None:
    """Two passes (mean, then centred squares): an offset of 1e4 over unit spread stays as good as eager.

    A one-pass E[x^2] - E[x]^2 in fp32 would lose the whole variance here (1e8 - 1e8).
    """
    x, lnw, lnb, w, b = (p.detach() for p in _leaves(18, 40, 20, seed=9))
    x = x + 1e4
    exact = ln_linear_gelu_reference(x.double(), lnw.double(), lnb.double(), w.double(), b.double(), gelu=False)
    eager_err = _rel(ln_linear_gelu_reference(x, lnw, lnb, w, b, gelu=False), exact)
    assert _rel(tf.ln_linear_gelu_triton(x, lnw, lnb, w, b, gelu=False), exact) < 2 * eager_err + 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_forward(dtype: torch.dtype) -> None:
    """bf16/fp16: fp32 statistics and accumulation, result in the input dtype, near the fp32 result."""
    params = _leaves(25, 32, 20, seed=11, dtype=dtype)
    y = tf.ln_linear_gelu_triton(*params)
    assert y.dtype == dtype
    params32 = [p.detach().float().requires_grad_(True) for p in params]
    ref = ln_linear_gelu_reference(*params32)
    assert _rel(y.float(), ref) < 2e-2
    gy = torch.randn(25, 20, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    grads = torch.autograd.grad(y, params, gy.to(dtype))
    for got, want in zip(grads, torch.autograd.grad(ref, params32, gy), strict=True):
        assert got.dtype == dtype and _rel(got.float(), want) < 5e-2


def test_unsupported_inputs_are_clear_errors() -> None:
    x, lnw, lnb, w, b = (p.detach() for p in _leaves(4, 8, 8, seed=1))
    with pytest.raises(HetrunError, match="approximate='erf'"):
        tf.ln_linear_gelu_triton(x, lnw, lnb, w, b, approximate="erf")
    with pytest.raises(HetrunError, match=r"dtype=torch\.float64"):
        tf.ln_linear_gelu_triton(x.double(), lnw, lnb, w.double(), b)


def test_disabled_turns_the_dispatch_off_but_not_direct_calls() -> None:
    x, lnw, lnb, w, b = (p.detach() for p in _leaves(9, 16, 16, seed=2))
    assert tf.supports(x, w, "none")
    with tf.disabled():
        assert not tf.supports(x, w, "none")
        assert _rel(tf.ln_linear_gelu_triton(x, lnw, lnb, w, b), ln_linear_gelu_reference(x, lnw, lnb, w, b)) < 1e-6
    assert tf.supports(x, w, "none")


@pytest.mark.skipif(DEVICE != "cpu", reason="checks that CPU tensors keep the CPU paths")
def test_cpu_tensors_never_take_the_triton_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with the interpreter on, ln_linear_gelu sends only CUDA tensors to Triton."""

    def _boom(*_a: object, **_k: object) -> torch.Tensor:
        raise AssertionError("CPU tensors reached the Triton path")

    monkeypatch.setattr(tf, "ln_linear_gelu_triton", _boom)
    params = [p.detach() for p in _leaves(9, 16, 16, seed=4)]
    assert _rel(ln_linear_gelu(*params), ln_linear_gelu_reference(*params)) < 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_cuda_ln_linear_gelu_dispatches_to_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = tf.ln_linear_gelu_triton

    def _counting(*a: object, **k: object) -> torch.Tensor:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(tf, "ln_linear_gelu_triton", _counting)
    params = _leaves(1000, 256, 1024, seed=12)
    y = ln_linear_gelu(*params)
    assert calls and y.is_cuda
    y_ref = ln_linear_gelu_reference(*params)
    assert _rel(y, y_ref) < 1e-6
    gy = torch.randn_like(y)
    for got, ref in zip(torch.autograd.grad(y, params, gy), torch.autograd.grad(y_ref, params, gy), strict=True):
        assert _rel(got, ref) < 1e-4
    for dtype in (torch.bfloat16, torch.float16):
        half = [p.detach().to(dtype) for p in params]
        assert _rel(ln_linear_gelu(*half).float(), ln_linear_gelu_reference(*half).float()) < 2e-2


def _routing(tokens: int, k: int, experts: int, seed: int) -> torch.Tensor:
    """token_index as gate_topk_permute builds it: each token k times, rows grouped by expert."""
    g = torch.Generator().manual_seed(seed)
    top_e = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    order = torch.sort(top_e.reshape(-1), stable=True).indices
    return torch.div(order, k, rounding_mode="floor").to(DEVICE)


@pytest.mark.parametrize(("tokens", "hdim", "k"), [(37, 29, 2), (5, 200, 3), (1, 16, 1)])
def test_moe_permute_and_combine_match_reference(tokens: int, hdim: int, k: int) -> None:
    from hetrun.kernels.moe_dispatch import unpermute_combine_reference

    g = torch.Generator().manual_seed(tokens)
    index = _routing(tokens, k, 4, seed=tokens)
    x = torch.randn(tokens, hdim, generator=g).to(DEVICE).requires_grad_(True)
    perm = tf.permute_rows_triton(x, index)
    assert torch.equal(perm, x[index])  # a gather is exact
    y = (torch.randn(tokens * k, hdim, generator=g).to(DEVICE) + perm).detach().requires_grad_(True)
    w = torch.rand(tokens * k, generator=g).to(DEVICE).requires_grad_(True)
    out = tf.combine_rows_triton(y, index, w, tokens)
    ref = unpermute_combine_reference(y, index, w, tokens)
    assert _rel(out, ref) < 1e-6
    if DEVICE == "cpu":  # same order of the same fp32 adds as the sequential index_add
        assert torch.equal(out, ref)
    go = torch.randn(tokens, hdim, generator=g).to(DEVICE)
    gy, gw = torch.autograd.grad(out, [y, w], go)
    gy_ref, gw_ref = torch.autograd.grad(ref, [y, w], go)
    assert _rel(gy, gy_ref) < 1e-6 and _rel(gw, gw_ref) < 1e-5
    gp = torch.randn_like(perm)
    (gx,) = torch.autograd.grad(perm, [x], gp)
    assert _rel(gx, torch.zeros_like(x).index_add_(0, index, gp)) < 1e-6


def test_moe_combine_leaves_unrouted_tokens_zero_and_is_deterministic() -> None:
    index = torch.tensor([3, 0, 3, 3], device=DEVICE)  # tokens 1, 2 and 4 get no rows
    y = torch.randn(4, 24, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    w = torch.tensor([0.5, 1.0, 0.25, 2.0], device=DEVICE)
    out = tf.combine_rows_triton(y, index, w, 5)
    assert torch.equal(out[[1, 2, 4]], torch.zeros(3, 24, device=DEVICE))
    assert torch.equal(out, tf.combine_rows_triton(y, index, w, 5))
    torch.testing.assert_close(out[3], 0.5 * y[0] + 0.25 * y[2] + 2.0 * y[3], rtol=1e-6, atol=1e-6)


def test_moe_bad_index_dtype_is_a_clear_error() -> None:
    with pytest.raises(HetrunError, match=r"token_index has dtype torch\.float32"):
        tf.permute_rows_triton(torch.randn(3, 4, device=DEVICE), torch.zeros(3, device=DEVICE))


@pytest.mark.skipif(DEVICE != "cpu", reason="checks that CPU tensors keep the CPU paths")
def test_moe_cpu_tensors_never_take_the_triton_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetrun.kernels.moe_dispatch import gate_topk_permute, unpermute_combine

    def _boom(*_a: object, **_k: object) -> torch.Tensor:
        raise AssertionError("CPU tensors reached the Triton path")

    monkeypatch.setattr(tf, "permute_rows_triton", _boom)
    monkeypatch.setattr(tf, "combine_rows_triton", _boom)
    d = gate_topk_permute(torch.randn(10, 8), torch.randn(4, 8), 2)
    assert unpermute_combine(d.permuted_x, d.token_index, d.weights, 10).shape == (10, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_cuda_moe_dispatch_uses_triton_and_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetrun.kernels.moe_dispatch import (
        gate_topk_permute,
        gate_topk_permute_reference,
        unpermute_combine,
        unpermute_combine_reference,
    )

    calls: list[str] = []
    for name in ("permute_rows_triton", "combine_rows_triton"):
        real = getattr(tf, name)
        monkeypatch.setattr(tf, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n), _r(*a, **k))[1])
    x = torch.randn(1000, 256, device="cuda", requires_grad=True)
    gate = torch.randn(8, 256, device="cuda")
    d = gate_topk_permute(x, gate, 2)
    d_ref = gate_topk_permute_reference(x, gate, 2)
    assert torch.equal(d.permuted_x, d_ref.permuted_x)
    out = unpermute_combine(d.permuted_x * 2, d.token_index, d.weights, 1000)
    ref = unpermute_combine_reference(d_ref.permuted_x * 2, d_ref.token_index, d_ref.weights, 1000)
    assert sorted(set(calls)) == ["combine_rows_triton", "permute_rows_triton"]
    assert _rel(out, ref) < 1e-6
    go = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, [x], go)
    (gx_ref,) = torch.autograd.grad(ref, [x], go)
    assert _rel(gx, gx_ref) < 1e-5

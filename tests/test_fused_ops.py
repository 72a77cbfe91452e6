"""Fused ops against their unfused references: forward 1e-6, gradients 1e-4 (fp32, relative to scale)."""

from __future__ import annotations

import pytest
import torch
from hetrun.kernels import fused_native
from hetrun.kernels.fused_ln_linear import (
    FusedLayerNormLinear,
    cpu_paths,
    ln_linear_gelu,
    ln_linear_gelu_reference,
)
from hetrun.kernels.moe_dispatch import (
    gate_topk_permute,
    gate_topk_permute_reference,
    unpermute_combine,
    unpermute_combine_reference,
)
from setup_tools import C_COMPILER, require

from hetrun.errors import HetrunError


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _leaves(*shapes: tuple[int, ...], seed: int = 0, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_(True) for s in shapes]


def _grads(fn, params, gy):
    for p in params:
        if p is not None:
            p.grad = None
    y = fn()
    y.backward(gy)
    return y.detach(), [None if p is None else p.grad.clone() for p in params]


@pytest.mark.parametrize(
    ("lead", "hdim", "fdim", "gelu", "bias", "affine", "approximate"),
    [
        ((3000,), 64, 96, True, True, True, "none"),
        ((2, 257), 32, 128, True, True, True, "tanh"),
        ((513,), 48, 40, False, True, True, "none"),
        ((64,), 16, 24, True, False, False, "none"),
        ((1,), 8, 8, True, True, True, "none"),
        ((512,), 256, 1024, True, True, True, "none"),  # K = 256: the summation order matters
    ],
)
def test_ln_linear_gelu_matches_eager(lead, hdim, fdim, gelu, bias, affine, approximate) -> None:
    x, lnw, lnb, w, b = _leaves((*lead, hdim), (hdim,), (hdim,), (fdim, hdim), (fdim,))
    with torch.no_grad():
        lnw.mul_(0.2).add_(1.0)
        w.mul_(hdim**-0.5)
    lnw_, lnb_ = (lnw, lnb) if affine else (None, None)
    b_ = b if bias else None
    params = [x, lnw_, lnb_, w, b_]
    gy = torch.randn((*lead, fdim), generator=torch.Generator().manual_seed(9))
    kw = {"gelu": gelu, "approximate": approximate}
    y_ref, g_ref = _grads(lambda: ln_linear_gelu_reference(x, lnw_, lnb_, w, b_, **kw), params, gy)
    y, g = _grads(lambda: ln_linear_gelu(x, lnw_, lnb_, w, b_, **kw), params, gy)
    assert y.shape == y_ref.shape
    assert _rel(y, y_ref) < 1e-6
    for name, a, r in zip(("x", "ln_weight", "ln_bias", "weight", "bias"), g, g_ref, strict=True):
        assert (a is None) == (r is None), name
        if a is not None:
            assert _rel(a, r) < 1e-4, (name, _rel(a, r))


_ALL_OFF = {"native_gelu_backward": False, "native_gelu_forward": False,
           "onednn_grad_input": False, "onednn_forward_max_h": 0}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "paths",
    [
        _ALL_OFF,
        {**_ALL_OFF, "native_gelu_backward": True, "native_max_threads": 64},
        {**_ALL_OFF, "native_gelu_forward": True, "onednn_forward_max_h": 1 << 30, "native_max_threads": 64},
        {**_ALL_OFF, "onednn_grad_input": True},
        {**_ALL_OFF, "onednn_forward_max_h": 1 << 30},
        {},  # the defaults: every CPU path on
    ],
    ids=["aten", "native-gelu-backward", "native-gelu-forward", "onednn-grad-input", "onednn-forward", "default"],
)
def test_every_cpu_path_matches_eager(paths: dict[str, bool | int], threads: int) -> None:
    """Each CPU fast path on its own and together, 1 and 2 threads (the C kernel splits rows)."""
    lead, hdim, fdim = (4100,), 64, 136  # long bias-gradient columns; rows not a multiple of the split
    x, lnw, lnb, w, b = _leaves((*lead, hdim), (hdim,), (hdim,), (fdim, hdim), (fdim,), seed=5)
    with torch.no_grad():
        lnw.mul_(0.2).add_(1.0)
        w.mul_(hdim**-0.5)
        x.mul_(3.0).add_(1.5)  # an offset mean: the LayerNorm fold must not cancel badly
    params = [x, lnw, lnb, w, b]
    gy = torch.randn((*lead, fdim), generator=torch.Generator().manual_seed(11))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y_ref, g_ref = _grads(lambda: ln_linear_gelu_reference(*params), params, gy)
        with cpu_paths(**paths):
            y, g = _grads(lambda: ln_linear_gelu(*params), params, gy)
            with torch.no_grad():  # the inference branch: GELU in place over the pre-activation
                y_inf = ln_linear_gelu(*params)
    finally:
        torch.set_num_threads(old)
    assert _rel(y, y_ref) < 1e-6
    assert _rel(y_inf, y_ref) < 1e-6 and not y_inf.requires_grad
    for name, a, r in zip(("x", "ln_weight", "ln_bias", "weight", "bias"), g, g_ref, strict=True):
        assert _rel(a, r) < 1e-4, (name, _rel(a, r))


def test_cpu_paths_restores_and_rejects_unknown() -> None:
    with cpu_paths(native_gelu_backward=False) as p:
        assert not p.native_gelu_backward
    with cpu_paths() as p:
        assert p.native_gelu_backward
    with pytest.raises(HetrunError, match=r"unknown CPU path\(s\) \['no_such_path'\]"), cpu_paths(no_such_path=True):
        pass


@pytest.mark.parametrize("threads", [1, 2])
def test_native_gelu_backward_bias_matches_aten(threads: int) -> None:
    require(fused_native.lib() is not None, C_COMPILER)  # without: the fused op uses ATen's GELU backward
    g = torch.Generator().manual_seed(2)
    h = torch.randn(3001, 77, generator=g) * 3
    h[0, :8] = torch.tensor([0.0, -0.0, 30.0, -30.0, 1e-8, -14.0, 95.0, -95.0])
    gy = torch.randn(3001, 77, generator=g)
    gh = torch.empty_like(h)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gb = fused_native.gelu_backward_bias(gy, h, gh)
    finally:
        torch.set_num_threads(old)
    ref = torch.ops.aten.gelu_backward(gy.double(), h.double())
    assert float((gh.double() - ref).abs().max()) < 1e-6 * float(ref.abs().max())
    assert _rel(gb.double(), ref.sum(0)) < 1e-6 and gb.dtype == torch.float32
    h[1, 3] = float("nan")  # a diverged activation must stay visible in the gradient
    fused_native.gelu_backward_bias(gy, h, gh)
    assert torch.isnan(gh[1, 3]) and torch.isfinite(gh[1, 4])


def test_native_gelu_forward_matches_aten_in_place_too() -> None:
    require(fused_native.lib() is not None, C_COMPILER)  # without: the fused op uses ATen's GELU
    h = torch.randn(70001, generator=torch.Generator().manual_seed(6)) * 4  # not a multiple of the split
    h[:6] = torch.tensor([0.0, -0.0, 30.0, -30.0, 1e-8, -95.0])
    ref = torch.nn.functional.gelu(h.double())
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        y = fused_native.gelu_forward(h, torch.empty_like(h))
        fused_native.gelu_forward(h, h)
    finally:
        torch.set_num_threads(old)
    assert _rel(y.double(), ref) < 1e-7
    assert torch.equal(h, y)


def test_native_kernels_refuse_bad_layouts() -> None:
    h = torch.randn(8, 6)
    with pytest.raises(HetrunError, match="contiguous float32 CPU"):
        fused_native.gelu_forward(h.t(), torch.empty(6, 8))
    with pytest.raises(HetrunError, match="contiguous float32 CPU"):
        fused_native.gelu_backward_bias(h, h.double(), torch.empty_like(h))
    with pytest.raises(HetrunError, match=r"needs \[T, F\]"):
        fused_native.gelu_backward_bias(h[0], h[1], torch.empty(6))


def test_ln_linear_gelu_gradcheck_float64() -> None:
    """The hand-written backward against finite differences."""
    x, lnw, lnb, w, b = _leaves((7, 6), (6,), (6,), (5, 6), (5,), dtype=torch.float64, seed=3)
    assert torch.autograd.gradcheck(lambda *a: ln_linear_gelu(*a), (x, lnw, lnb, w, b))


def test_module_and_partial_grads() -> None:
    mod = FusedLayerNormLinear(32, 64)
    x = torch.randn(10, 32)  # no grad for x: only the parameters'
    mod(x).sum().backward()
    assert all(p.grad is not None for p in mod.parameters())
    ref = ln_linear_gelu_reference(x, mod.norm.weight, mod.norm.bias, mod.linear.weight, mod.linear.bias)
    assert _rel(mod(x).detach(), ref.detach()) < 1e-6


@pytest.mark.parametrize(("tokens", "experts", "k"), [(200, 8, 2), (33, 4, 1), (64, 6, 3), (5, 16, 2)])
def test_gate_topk_permute_and_combine_match_reference(tokens: int, experts: int, k: int) -> None:
    x, gw, ew = _leaves((tokens, 24), (experts, 24), (24, 24), seed=tokens)
    params = [x, gw, ew]
    gy = torch.randn(tokens, 24, generator=torch.Generator().manual_seed(1))

    def moe(dispatch, combine):
        d = dispatch(x, gw, k)
        y = torch.tanh(d.permuted_x @ ew)  # stand-in expert: a shared matrix
        return d, combine(y, d.token_index, d.weights, tokens)

    d, out = moe(gate_topk_permute, unpermute_combine)
    d_ref, out_ref = moe(gate_topk_permute_reference, unpermute_combine_reference)
    assert d.splits == d_ref.splits and sum(d.splits) == tokens * k
    assert torch.equal(d.token_index, d_ref.token_index)
    assert torch.equal(d.permuted_x, d_ref.permuted_x)
    assert _rel(d.weights, d_ref.weights) < 1e-6
    assert _rel(out, out_ref) < 1e-6
    # rows are grouped by expert: the splits describe contiguous runs
    experts_of_rows = torch.repeat_interleave(torch.arange(experts), torch.tensor(d.splits))
    top_e = torch.topk(d.probs, k, dim=-1).indices
    assert bool((top_e[d.token_index] == experts_of_rows[:, None]).any(dim=1).all())

    _, g = _grads(lambda: moe(gate_topk_permute, unpermute_combine)[1], params, gy)
    _, g_ref = _grads(lambda: moe(gate_topk_permute_reference, unpermute_combine_reference)[1], params, gy)
    for name, a, r in zip(("x", "gate_weight", "expert"), g, g_ref, strict=True):
        assert _rel(a, r) < 1e-4, (name, _rel(a, r))


def test_combine_gradcheck_float64() -> None:
    g = torch.Generator().manual_seed(4)
    y = torch.randn(9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.rand(9, dtype=torch.float64, generator=g, requires_grad=True)
    idx = torch.tensor([0, 2, 1, 0, 3, 3, 2, 1, 0])
    assert torch.autograd.gradcheck(lambda a, b: unpermute_combine(a, idx, b, 4), (y, w))
    x = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    gwt = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: gate_topk_permute(a, b, 2).permuted_x, (x, gwt))


def test_bad_k_is_a_clear_error() -> None:
    with pytest.raises(HetrunError, match="k=5 must be between 1 and the number of experts"):
        gate_topk_permute(torch.randn(4, 8), torch.randn(4, 8), 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_ln_linear_gelu_on_cuda_aten_path_with_triton_off() -> None:
    """Off the CPU no C or oneDNN path applies: with Triton switched off the same
    Function runs cuBLAS/ATen ops (the Triton path has tests/test_triton_fused.py)."""
    from hetrun.kernels import triton_fused

    leaves = _leaves((300, 64), (64,), (64,), (96, 64), (96,))
    params = [t.detach().cuda().requires_grad_() for t in leaves]
    gy = torch.randn(300, 96, device="cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs on both sides, as on the CPU
    try:
        y_ref, g_ref = _grads(lambda: ln_linear_gelu_reference(*params), params, gy)
        with triton_fused.disabled():
            y, g = _grads(lambda: ln_linear_gelu(*params), params, gy)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert y.is_cuda and _rel(y, y_ref) < 1e-6
    for a, r in zip(g, g_ref, strict=True):
        assert _rel(a, r) < 1e-4


def test_loading_the_c_kernels_keeps_subnormals() -> None:  # every native library, not just this op's
    """A library linked with -ffast-math sets flush-to-zero for the whole process
    when loaded (crtfastmath.o); the fused kernels must not change global numerics."""
    import subprocess
    import sys

    code = (
        "import numpy as np, torch\n"
        "from hetrun.kernels import fused_native, byteplanes\n"
        "from hetrun.kernels.codecs import native as codec_native\n"
        "assert fused_native.lib() is not None\n"
        "codec_native.lib(); byteplanes.native()  # every C library hetrun builds\n"
        "tiny = np.float32(1e-40)\n"
        "assert tiny * np.float32(1.0) != 0, 'numpy flushes subnormals'\n"
        "assert float(torch.tensor(1e-40) * 1.0) != 0.0, 'torch flushes subnormals'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr

"""Triton codec kernels against the PyTorch reference.

On CPU through the Triton interpreter (``TRITON_INTERPRET=1``, set here before
triton is imported; kept small, the interpreter is slow); on a GPU the same
checks run compiled. Skipped explicitly when Triton is not installed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from hetrun.kernels.codecs import reference as ref
from hetrun.kernels.codecs import triton_gpu as tc
from setup_tools import TRITON, needs

pytestmark = needs(tc.available(), TRITON)
DEVICE = "cuda" if torch.cuda.is_available() and os.environ["TRITON_INTERPRET"] != "1" else "cpu"
SIZES = [1, 9, 64, 200, 517]


def _x(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3
    if n > 130:
        x[64:128] = 0.0
        x[130] = -0.0
    return x.to(DEVICE)


def _payload(n: int, block: int, bits_per: float) -> torch.Tensor:
    nb = -(-n // block)
    return torch.full((4 * nb + int(-(-n * bits_per // 8)),), 7, dtype=torch.uint8, device=DEVICE)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", [64, 32])
def test_onebit_encode_decode(n: int, block: int) -> None:
    x = _x(n, n)
    out = _payload(n, block, 1)
    tc.onebit_encode(x, out, block)
    expect = ref.onebit_encode(x.cpu(), block).to(DEVICE)
    nb = -(-n // block)
    assert torch.equal(out[4 * nb :], expect[4 * nb :])
    torch.testing.assert_close(out[: 4 * nb].view(torch.float32), expect[: 4 * nb].view(torch.float32), rtol=1e-6, atol=0)
    dec = torch.empty(n, device=DEVICE)
    tc.onebit_decode(out, dec, block)
    assert torch.equal(dec.cpu(), ref.onebit_decode(out.cpu(), n, block))


@pytest.mark.parametrize("n", [9, 517])
def test_onebit_error_feedback_fused(n: int) -> None:
    x, r0 = _x(n, 1), _x(n, 2) * 0.1
    res = r0.clone()
    out = _payload(n, 64, 1)
    tc.onebit_encode(x, out, 64, residual=res)
    c = (x + r0).cpu()
    expect = ref.onebit_encode(c, 64)
    nb = -(-n // 64)
    assert torch.equal(out[4 * nb :].cpu(), expect[4 * nb :])
    torch.testing.assert_close(res.cpu(), c - ref.onebit_decode(out.cpu(), n, 64), rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", SIZES)
def test_int8_bit_for_bit(n: int) -> None:
    x = _x(n, 10 + n)
    x[: min(n, 4)] = torch.tensor([0.5, -1.5, 2.5, 127.0][: min(n, 4)], device=DEVICE)  # ties
    out = _payload(n, 64, 8)
    tc.int8_encode(x, out, 64)
    assert torch.equal(out.cpu(), ref.int8_encode(x.cpu(), 64))
    dec = torch.empty(n, device=DEVICE)
    tc.int8_decode(out, dec, 64)
    assert torch.equal(dec.cpu(), ref.int8_decode(out.cpu(), n, 64))


@pytest.mark.parametrize("n", [9, 517])
def test_bf16_scales(n: int) -> None:
    """bf16 block scales: int8 bit for bit, 1-bit (with error feedback) signs and scales."""
    x, r0 = _x(n, 20 + n), _x(n, 30 + n) * 0.1
    nb = -(-n // 64)
    out = torch.zeros(2 * nb + n, dtype=torch.uint8, device=DEVICE)
    tc.int8_encode(x, out, 64, bf16=True)
    assert torch.equal(out.cpu(), ref.int8_encode(x.cpu(), 64, bf16=True))
    dec = torch.empty(n, device=DEVICE)
    tc.int8_decode(out, dec, 64, bf16=True)
    assert torch.equal(dec.cpu(), ref.int8_decode(out.cpu(), n, 64, bf16=True))
    res = r0.clone()
    out = torch.zeros(2 * nb + (n + 7) // 8, dtype=torch.uint8, device=DEVICE)
    tc.onebit_encode(x, out, 64, residual=res, bf16=True)
    c = (x + r0).cpu()
    expect = ref.onebit_encode(c, 64, bf16=True)
    assert torch.equal(out[2 * nb :].cpu(), expect[2 * nb :])
    # bf16 keeps 8 bits: block sums in another order round to the same scale, or one ulp off
    got_s = out[: 2 * nb].cpu().view(torch.int16).int()
    assert bool(((got_s - expect[: 2 * nb].view(torch.int16).int()).abs() <= 1).all())
    decoded = ref.onebit_decode(out.cpu(), n, 64, bf16=True)
    torch.testing.assert_close(res.cpu(), c - decoded, rtol=0, atol=1e-6)
    tc.onebit_decode(out, dec, 64, bf16=True)
    assert torch.equal(dec.cpu(), decoded)


def test_supports_only_power_of_two_blocks() -> None:
    assert tc.supports(256) and tc.supports(8)
    assert not tc.supports(24) and not tc.supports(4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_codecs_use_triton_on_gpu() -> None:
    from hetrun.kernels.codecs.registry import get_codec

    for name in ("onebit", "onebit_ef", "int8"):
        codec = get_codec(name)
        x = torch.randn(1 << 20, device="cuda")
        enc = codec.encode(x, codec.new_state() if codec.stateful else None)
        dec = codec.decode(enc)
        cpu = get_codec(name).decode(get_codec(name).encode(x.cpu()))
        torch.testing.assert_close(dec.cpu(), cpu, rtol=1e-5, atol=1e-5)

"""Triton kernels for the codecs: one program per block fuses the scale and the packing.

Each program loads one block once, reduces it to its scale, quantises and
packs it and (error feedback) writes the new residual, so a GPU encode reads
the input once and writes only the payload. The wire format is
``reference``'s. Tested on CPU with ``TRITON_INTERPRET=1`` against the
reference, on a GPU when one is present.

Triton is optional (``pip install triton``): :func:`available` says whether
these kernels can run here; the codecs fall back to the PyTorch reference.
"""

from __future__ import annotations

import os

import torch

try:  # Triton is an optional GPU dependency
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = ["available", "int8_decode", "int8_encode", "onebit_decode", "onebit_encode", "supports"]


def available() -> bool:
    """Triton importable and something to run it on (a GPU, or the CPU interpreter)."""
    if triton is None:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def supports(block: int) -> bool:
    # tl.arange needs a power-of-two length; one byte row is 8 elements.
    return block >= 8 and block & (block - 1) == 0


if triton is not None:

    @triton.jit
    def _store_scale(scale_ptr, pid, scale, BF16: tl.constexpr):
        """Store one block scale (fp32, or bf16 rounded to nearest even); returns the value stored."""
        if BF16:
            u = scale.to(tl.uint32, bitcast=True)
            u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
            tl.store(scale_ptr + pid, (u >> 16).to(tl.int16))
            scale = u.to(tl.float32, bitcast=True)
        else:
            tl.store(scale_ptr + pid, scale)
        return scale

    @triton.jit
    def _load_scale(scale_ptr, pid, BF16: tl.constexpr):
        if BF16:
            u = (tl.load(scale_ptr + pid).to(tl.int32) & 0xFFFF) << 16
            return u.to(tl.float32, bitcast=True)
        return tl.load(scale_ptr + pid)

    @triton.jit
    def _onebit_encode_kernel(
        x_ptr, res_ptr, scale_ptr, bits_ptr, n, BLOCK: tl.constexpr, HAS_RES: tl.constexpr,
        BF16: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            x = x + tl.load(res_ptr + offs, mask=mask, other=0.0)
        count = tl.minimum(n - pid * BLOCK, BLOCK)
        scale = _store_scale(scale_ptr, pid, tl.sum(tl.abs(x), axis=0) / count.to(tl.float32), BF16)
        neg = (x.to(tl.int32, bitcast=True) < 0).to(tl.int32)  # the sign bit, -0.0 included
        weights = (1 << tl.arange(0, 8)).to(tl.int32)
        packed = tl.sum(tl.reshape(neg, (BLOCK // 8, 8)) * weights[None, :], axis=1)
        boffs = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
        tl.store(bits_ptr + boffs, packed.to(tl.uint8), mask=boffs < (n + 7) // 8)
        if HAS_RES:
            decoded = tl.where(neg != 0, -scale, scale)
            tl.store(res_ptr + offs, x - decoded, mask=mask)

    @triton.jit
    def _onebit_decode_kernel(scale_ptr, bits_ptr, out_ptr, n, BLOCK: tl.constexpr, BF16: tl.constexpr):
        pid = tl.program_id(0)
        boffs = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
        packed = tl.load(bits_ptr + boffs, mask=boffs < (n + 7) // 8, other=0).to(tl.int32)
        bits = (packed[:, None] >> tl.arange(0, 8)[None, :]) & 1
        scale = _load_scale(scale_ptr, pid, BF16)
        vals = tl.where(tl.reshape(bits, (BLOCK,)) != 0, -scale, scale)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, vals.to(out_ptr.dtype.element_ty), mask=offs < n)

    @triton.jit
    def _int8_encode_kernel(x_ptr, scale_ptr, q_ptr, n, BLOCK: tl.constexpr, BF16: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        # correctly rounded divisions, as the reference (GPU '/' may be approximate)
        scale = _store_scale(scale_ptr, pid, tl.math.div_rn(amax, tl.full((), 127.0, tl.float32)), BF16)
        if BF16:
            safe = tl.where(scale > 0, scale, 1.0)
            inv = tl.where(scale > 0, tl.math.div_rn(tl.full((), 1.0, tl.float32), safe), 0.0)
        else:
            safe = tl.where(amax > 0, amax, 1.0)
            inv = tl.where(amax > 0, tl.math.div_rn(tl.full((), 127.0, tl.float32), safe), 0.0)
        y = x * inv
        # round half to even (torch.round / np.rint), written out for portability
        f = tl.floor(y)
        d = y - f
        f_odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
        r = tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(f_odd, f + 1.0, f)))
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        tl.store(q_ptr + offs, r.to(tl.int8), mask=mask)

    @triton.jit
    def _int8_decode_kernel(scale_ptr, q_ptr, out_ptr, n, BLOCK: tl.constexpr, BF16: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        q = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.float32)
        scale = _load_scale(scale_ptr, pid, BF16)
        tl.store(out_ptr + offs, (q * scale).to(out_ptr.dtype.element_ty), mask=mask)


def _split(
    payload: torch.Tensor, n: int, block: int, bf16: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Scales (fp32, or bf16 bits as int16) and values of a payload, and the block count."""
    nb = -(-n // block)
    if bf16:
        return payload[: 2 * nb].view(torch.int16), payload[2 * nb :], nb
    return payload[: 4 * nb].view(torch.float32), payload[4 * nb :], nb


def onebit_encode(
    x: torch.Tensor, out: torch.Tensor, block: int, residual: torch.Tensor | None = None,
    bf16: bool = False,
) -> None:
    n = x.numel()
    scales, bits, nb = _split(out, n, block, bf16)
    res = residual if residual is not None else x  # unused pointer when HAS_RES is False
    _onebit_encode_kernel[(nb,)](
        x, res, scales, bits, n, BLOCK=block, HAS_RES=residual is not None, BF16=bf16
    )


def onebit_decode(payload: torch.Tensor, out: torch.Tensor, block: int, bf16: bool = False) -> None:
    n = out.numel()
    scales, bits, nb = _split(payload, n, block, bf16)
    _onebit_decode_kernel[(nb,)](scales, bits, out.reshape(-1), n, BLOCK=block, BF16=bf16)


def int8_encode(x: torch.Tensor, out: torch.Tensor, block: int, bf16: bool = False) -> None:
    n = x.numel()
    scales, body, nb = _split(out, n, block, bf16)
    _int8_encode_kernel[(nb,)](x, scales, body[:n].view(torch.int8), n, BLOCK=block, BF16=bf16)


def int8_decode(payload: torch.Tensor, out: torch.Tensor, block: int, bf16: bool = False) -> None:
    n = out.numel()
    scales, body, nb = _split(payload, n, block, bf16)
    _int8_decode_kernel[(nb,)](
        scales, body[:n].view(torch.int8), out.reshape(-1), n, BLOCK=block, BF16=bf16
    )

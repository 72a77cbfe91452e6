"""Plain PyTorch reference implementations of the codecs' wire formats.

Written for clarity, not speed: whole-tensor ops, full-size temporaries. The
fast CPU path (``cpu``) and the Triton kernels (``triton_gpu``) are
tested against these. They also serve CUDA tensors when Triton is missing.

Formats (``n`` elements, block size ``B``, ``nb = ceil(n / B)`` blocks):

- 1-bit: ``nb`` fp32 scales, then ``ceil(n / 8)`` bytes of sign bits, element
  ``8*i + j`` in bit ``j`` of byte ``i`` (little bit order); a set bit means
  negative. Deterministic scale: mean |x| of the block (the L2-optimal
  magnitude for a sign code). Stochastic scale: max |x| ``M`` of the block,
  element ``i`` negative iff ``x < M * (1 - u24 * 2^-23)`` with ``u24`` the
  counter-based draw :func:`stochastic_uniform24` (so the decoded value is
  ``x`` in expectation, and every path draws the same numbers).
- int8: ``nb`` fp32 scales (absmax / 127), then ``n`` int8 values
  ``rint(x * (127 / absmax))``.
- ``bf16=True`` (1-bit and int8): the scales travel as bf16, 2 bytes each (the
  fp32 scale rounded to nearest even, :func:`bf16_round`); the 1-bit error
  feedback residual uses the rounded scale, and int8 quantises with
  ``rint(x * (1 / scale))``, clamped to +-127.
- fp8: ``nb`` fp32 scales (absmax / 448), then ``n`` float8_e4m3fn values of
  ``x * (448 / absmax)``.
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
FP8_MAX = 448.0


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` zero-padded to whole blocks [nb, block], and the element count per block [nb]."""
    n = x.numel()
    nb = -(-n // block)
    padded = torch.zeros(nb * block, dtype=torch.float32, device=x.device)
    padded[:n] = x.reshape(-1).float()
    counts = torch.full((nb,), float(block), device=x.device)
    if nb:
        counts[-1] = float(n - (nb - 1) * block)
    return padded.reshape(nb, block), counts


def _pack_bits(neg: torch.Tensor) -> torch.Tensor:
    n = neg.numel()
    pad = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=neg.device)
    pad[:n] = neg.reshape(-1).to(torch.uint8)
    weights = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8, device=neg.device)
    return (pad.reshape(-1, 8) * weights).sum(dim=1, dtype=torch.int32).to(torch.uint8)


def _unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return ((bits.reshape(-1, 1) >> shifts) & 1).reshape(-1)[:n].bool()


def _scales_view(payload: torch.Tensor, nb: int) -> torch.Tensor:
    return payload[: 4 * nb].view(torch.float32)


def bf16_round(t: torch.Tensor) -> torch.Tensor:
    """float32 ``t`` rounded to bf16 precision (nearest even), by its bits as the kernels do."""
    u = t.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32).view(torch.float32)


def _scale_bytes(scales: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The wire bytes of float32 ``scales`` (already bf16-rounded when ``bf16``)."""
    if not bf16:
        return scales.view(torch.uint8)
    return (scales.view(torch.int32) >> 16).to(torch.int16).view(torch.uint8)


def _read_scales(payload: torch.Tensor, nb: int, bf16: bool) -> tuple[torch.Tensor, int]:
    """float32 scales and where the values start."""
    if not bf16:
        return _scales_view(payload, nb), 4 * nb
    bits = payload[: 2 * nb].view(torch.int16).to(torch.int32) << 16
    return bits.view(torch.float32), 2 * nb


def onebit_encode(x: torch.Tensor, block: int, bf16: bool = False) -> torch.Tensor:
    blocks, counts = _blocks(x, block)
    scales = blocks.abs().sum(dim=1) / counts
    if bf16:
        scales = bf16_round(scales)
    neg = torch.signbit(x.reshape(-1).float())
    return torch.cat([_scale_bytes(scales, bf16), _pack_bits(neg)])


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for int64 ``x`` < 2^32, in halves so no product overflows int64."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stochastic_uniform24(n: int, k0: int, k1: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The stochastic codec's draws: ``u24[i] = (lowbias32(i + k0 + hi(i) * φ) ^ k1) >> 8``.

    A counter-based generator (one hash per element index, keyed by the
    32-bit words ``k0``, ``k1``), so the C kernel computes the same numbers 8
    at a time and any device can reproduce them; int64 ``[n]`` in [0, 2^24).
    """
    i = torch.arange(n, dtype=torch.int64, device=device)
    return (_lowbias32((i + k0 + _mul32(i >> 32, 0x9E3779B9)) & _M32) ^ k1) >> 8


def onebit_stochastic_encode(x: torch.Tensor, block: int, k0: int, k1: int) -> torch.Tensor:
    """Negative iff x < M * (1 - u24 * 2^-23) (all float32, exact up to the product)."""
    blocks, _ = _blocks(x, block)
    amax = blocks.abs().amax(dim=1)
    n = x.numel()
    u24 = stochastic_uniform24(n, k0, k1, x.device).to(torch.float32)
    thresh = (amax.repeat_interleave(block)[:n]) * (1.0 - u24 * 2.0**-23)
    neg = x.reshape(-1).float() < thresh
    return torch.cat([amax.view(torch.uint8), _pack_bits(neg)])


def onebit_decode(payload: torch.Tensor, n: int, block: int, bf16: bool = False) -> torch.Tensor:
    nb = -(-n // block)
    scales, k = _read_scales(payload, nb, bf16)
    neg = _unpack_bits(payload[k:], n)
    mag = scales.repeat_interleave(block)[:n]
    return torch.where(neg, -mag, mag)


def int8_encode(x: torch.Tensor, block: int, bf16: bool = False) -> torch.Tensor:
    blocks, _ = _blocks(x, block)
    amax = blocks.abs().amax(dim=1)
    scales = amax / INT8_MAX
    if bf16:
        scales = bf16_round(scales)
        inv = torch.where(scales > 0, torch.ones_like(scales) / scales, torch.zeros_like(scales))
    else:
        # Tensor / tensor: ``127 / t`` would be computed as reciprocal * 127 and round differently.
        inv = torch.where(amax > 0, torch.full_like(amax, INT8_MAX) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return torch.cat([_scale_bytes(scales, bf16), q.reshape(-1)[: x.numel()].view(torch.uint8)])


def int8_decode(payload: torch.Tensor, n: int, block: int, bf16: bool = False) -> torch.Tensor:
    nb = -(-n // block)
    scales, k = _read_scales(payload, nb, bf16)
    q = payload[k : k + n].view(torch.int8).float()
    return q * scales.repeat_interleave(block)[:n]


INT4_MAX = 7.0


def int4_encode(x: torch.Tensor, block: int, bf16: bool = False) -> torch.Tensor:
    """Scales (absmax / 7), then two 4-bit values per byte: element ``2i`` in the low nibble,
    ``2i + 1`` in the high one, each stored as ``q + 8`` with ``q = rint(x / scale)`` in [-7, 7]."""
    blocks, _ = _blocks(x, block)
    amax = blocks.abs().amax(dim=1)
    scales = amax / INT4_MAX
    if bf16:
        scales = bf16_round(scales)
        inv = torch.where(scales > 0, torch.ones_like(scales) / scales, torch.zeros_like(scales))
    else:
        inv = torch.where(amax > 0, torch.full_like(amax, INT4_MAX) / amax, torch.zeros_like(amax))
    n = x.numel()
    q = torch.round(blocks * inv[:, None]).clamp_(-INT4_MAX, INT4_MAX).reshape(-1)[:n]
    nibbles = torch.full((n + (n & 1),), 8, dtype=torch.uint8, device=x.device)
    nibbles[:n] = (q + 8).to(torch.uint8)
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return torch.cat([_scale_bytes(scales, bf16), packed])


def int4_decode(payload: torch.Tensor, n: int, block: int, bf16: bool = False) -> torch.Tensor:
    nb = -(-n // block)
    scales, k = _read_scales(payload, nb, bf16)
    packed = payload[k : k + (n + 1) // 2]
    q = torch.stack([packed & 15, packed >> 4], dim=1).reshape(-1)[:n].float() - 8.0
    return q * scales.repeat_interleave(block)[:n]


def fp8_encode(x: torch.Tensor, block: int) -> torch.Tensor:
    blocks, _ = _blocks(x, block)
    amax = blocks.abs().amax(dim=1)
    inv = torch.where(amax > 0, torch.full_like(amax, FP8_MAX) / amax, torch.zeros_like(amax))
    y = (blocks * inv[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    scales = amax / FP8_MAX
    return torch.cat([scales.view(torch.uint8), y.reshape(-1)[: x.numel()].view(torch.uint8)])


def fp8_decode(payload: torch.Tensor, n: int, block: int) -> torch.Tensor:
    nb = -(-n // block)
    scales = _scales_view(payload, nb)
    y = payload[4 * nb : 4 * nb + n].view(torch.float8_e4m3fn).float()
    return y * scales.repeat_interleave(block)[:n]

"""Plain PyTorch reference implementations of the codecs' wire formats.

Written for clarity, not speed: whole-tensor ops, full-size temporaries. The
fast CPU path (``codec_cpu``) and the Triton kernels (``triton_codecs``) are
tested against these. They also serve CUDA tensors when Triton is missing.

Formats (``n`` elements, block size ``B``, ``nb = ceil(n / B)`` blocks):

- 1-bit: ``nb`` fp32 scales, then ``ceil(n / 8)`` bytes of sign bits, element
  ``8*i + j`` in bit ``j`` of byte ``i`` (little bit order); a set bit means
  negative. Deterministic scale: mean |x| of the block (the L2-optimal
  magnitude for a sign code). Stochastic scale: max |x| of the block, with the
  sign drawn so that the decoded value is ``x`` in expectation.
- int8: ``nb`` fp32 scales (absmax / 127), then ``n`` int8 values
  ``rint(x * (127 / absmax))``.
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


def onebit_encode(x: torch.Tensor, block: int) -> torch.Tensor:
    blocks, counts = _blocks(x, block)
    scales = blocks.abs().sum(dim=1) / counts
    neg = torch.signbit(x.reshape(-1).float())
    return torch.cat([scales.view(torch.uint8), _pack_bits(neg)])


def onebit_stochastic_encode(x: torch.Tensor, block: int, uniform: torch.Tensor) -> torch.Tensor:
    """``uniform``: one U[0, 1) draw per element; negative iff x < M * (1 - 2u)."""
    blocks, _ = _blocks(x, block)
    amax = blocks.abs().amax(dim=1)
    n = x.numel()
    thresh = (amax.repeat_interleave(block)[:n]) * (1.0 - 2.0 * uniform.reshape(-1))
    neg = x.reshape(-1).float() < thresh
    return torch.cat([amax.view(torch.uint8), _pack_bits(neg)])


def onebit_decode(payload: torch.Tensor, n: int, block: int) -> torch.Tensor:
    nb = -(-n // block)
    scales = _scales_view(payload, nb)
    neg = _unpack_bits(payload[4 * nb :], n)
    mag = scales.repeat_interleave(block)[:n]
    return torch.where(neg, -mag, mag)


def int8_encode(x: torch.Tensor, block: int) -> torch.Tensor:
    blocks, _ = _blocks(x, block)
    amax = blocks.abs().amax(dim=1)
    # Tensor / tensor: ``127 / t`` would be computed as reciprocal * 127 and round differently.
    inv = torch.where(amax > 0, torch.full_like(amax, INT8_MAX) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    scales = amax / INT8_MAX
    return torch.cat([scales.view(torch.uint8), q.reshape(-1)[: x.numel()].view(torch.uint8)])


def int8_decode(payload: torch.Tensor, n: int, block: int) -> torch.Tensor:
    nb = -(-n // block)
    scales = _scales_view(payload, nb)
    q = payload[4 * nb : 4 * nb + n].view(torch.int8).float()
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

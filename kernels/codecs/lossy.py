"""The lossy codecs: 1-bit (plain, error feedback, stochastic), int8 and fp8 blockwise.

Each dispatches on where the tensor lives: CPU float32 goes through the
cache-blocked numpy path (``cpu``), CUDA tensors through the Triton
kernels (``triton_gpu``) when Triton is installed, anything else through
the PyTorch reference (``reference``). All paths write the same payload.
"""

from __future__ import annotations

import numpy as np
import torch

from . import cpu, native, reference
from .base import DEFAULT_BLOCK, Codec, CodecError, ErrorFeedbackState

__all__ = ["Fp8Codec", "Int4Codec", "Int8Codec", "OneBitCodec", "OneBitEFCodec", "OneBitStochasticCodec"]


def _triton(block: int):
    """The Triton kernels for CUDA tensors, when installed and the block size suits them."""
    from . import triton_gpu

    if triton_gpu.available() and triton_gpu.supports(block):
        return triton_gpu
    return None


def _check(codec: Codec, x: torch.Tensor, out: torch.Tensor) -> None:
    if out.dtype != torch.uint8 or out.numel() != codec.wire_bytes(x.numel()):
        raise CodecError(
            f"codec {codec.name!r}: payload buffer is {out.dtype}[{out.numel()}], "
            f"uint8[{codec.wire_bytes(x.numel())}] needed for {x.numel()} elements",
            hint="allocate it with codec.wire_bytes(numel)",
        )
    if not x.is_floating_point():
        raise CodecError(
            f"codec {codec.name!r}: cannot encode a {x.dtype} tensor",
            hint="codecs compress floating-point tensors (activations, gradients)",
        )


def _as_f32_numpy(x: torch.Tensor) -> np.ndarray:
    flat = x.reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.float()
    return flat.contiguous().numpy()


def _decode_cpu(out: torch.Tensor, fill) -> None:
    if out.dtype == torch.float32 and out.is_contiguous():
        fill(out.reshape(-1).numpy())
    else:
        tmp = torch.empty(out.numel(), dtype=torch.float32)
        fill(tmp.numpy())
        out.reshape(-1).copy_(tmp)


SCALE_DTYPES = ("fp32", "bf16")


class _BlockKernelCodec(Codec):
    """A codec whose encode/decode are the ``<kernel>_encode``/``<kernel>_decode``
    functions of the CPU path, the Triton path and the reference, in that order
    of preference (CPU tensors -> vectorized CPU path; GPU -> Triton when it is
    installed, else the reference).

    ``scale_dtype``: ``fp32`` (4 bytes per block) or ``bf16`` (2 bytes: half the
    scales' share of the wire, which is what lets small blocks, and so finer
    scales, fit a given volume; see benchmarks/kernels.md section 5).
    """

    kernel = ""

    def __init__(self, block_size: int = DEFAULT_BLOCK, scale_dtype: str = "fp32") -> None:
        super().__init__(block_size)
        if scale_dtype not in SCALE_DTYPES:
            raise CodecError(
                f"codec {self.name!r}: scale_dtype {scale_dtype!r} is not one of {list(SCALE_DTYPES)}",
                hint="fp32 (4 bytes per block scale) or bf16 (2 bytes)",
            )
        self.scale_dtype = scale_dtype
        self.bf16 = scale_dtype == "bf16"
        self.scale_bytes = 2 if self.bf16 else 4

    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        _check(self, x, out)
        if x.numel() == 0:
            return
        enc = f"{self.kernel}_encode"
        if x.device.type == "cpu":
            getattr(cpu, enc)(_as_f32_numpy(x), out.numpy(), self.block_size, bf16=self.bf16)
        elif (tr := _triton(self.block_size)) is not None:
            getattr(tr, enc)(x.reshape(-1), out, self.block_size, bf16=self.bf16)
        else:
            out.copy_(getattr(reference, enc)(x, self.block_size, bf16=self.bf16))

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        if out.numel() == 0:
            return
        dec = f"{self.kernel}_decode"
        b, bf16 = self.block_size, self.bf16
        if out.device.type == "cpu":
            _decode_cpu(out, lambda o: getattr(cpu, dec)(payload.numpy(), o, b, bf16=bf16))
        elif (tr := _triton(self.block_size)) is not None:
            getattr(tr, dec)(payload, out, b, bf16=bf16)
        else:
            out.reshape(-1).copy_(getattr(reference, dec)(payload, out.numel(), b, bf16=bf16))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_size={self.block_size}, scale_dtype={self.scale_dtype!r})"


class OneBitCodec(_BlockKernelCodec):
    """``onebit``: sign bits (8 per byte) + one scale (mean |x|) per block. ~28x at B=256 (fp32 scales)."""

    name = "onebit"
    kernel = "onebit"

    def wire_bytes(self, numel: int) -> int:
        return self.scale_bytes * self.num_blocks(numel) + (numel + 7) // 8


class OneBitEFCodec(OneBitCodec):
    """``onebit_ef``: 1-bit with error feedback (as in 1-bit Adam).

    Encodes ``x + residual`` and keeps what the code lost in the residual for
    the next step, so over many steps the sum of decoded values tracks the sum
    of inputs. Needs an :class:`ErrorFeedbackState` per stream; without one it
    is plain 1-bit.
    """

    name = "onebit_ef"
    stateful = True

    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        if state is None:
            super().encode_into(x, out)
            return
        _check(self, x, out)
        if x.numel() == 0:
            return
        residual = state.residual_for(x.numel(), x.device)
        state.steps += 1
        b, bf16 = self.block_size, self.bf16
        if x.device.type == "cpu":
            cpu.onebit_encode(_as_f32_numpy(x), out.numpy(), b, residual=residual.numpy(), bf16=bf16)
        elif (tr := _triton(self.block_size)) is not None:
            tr.onebit_encode(x.reshape(-1), out, b, residual=residual, bf16=bf16)
        else:
            c = x.reshape(-1).float() + residual
            out.copy_(reference.onebit_encode(c, b, bf16=bf16))
            residual.copy_(c - reference.onebit_decode(out, c.numel(), b, bf16=bf16))


_M64 = (1 << 64) - 1


def stochastic_keys(seed: int, call: int) -> tuple[int, int]:
    """The two 32-bit words keying call number ``call`` of a stochastic codec seeded ``seed``
    (splitmix64 of both, so nearby seeds and calls give unrelated draws)."""
    z = (seed * 0x9E3779B97F4A7C15 + (call + 1) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return z & 0xFFFFFFFF, z >> 32


class OneBitStochasticCodec(OneBitCodec):
    """``onebit_stochastic``: unbiased 1-bit; scale = block absmax, sign drawn so E[decode] = x.

    The draws come from a counter-based generator keyed by ``(seed, call
    number)`` (:func:`stochastic_keys`, ``reference.stochastic_uniform24``):
    every path (C, numpy, torch on any device) writes the same payload for the
    same seed and call sequence.
    """

    name = "onebit_stochastic"

    def __init__(self, block_size: int = DEFAULT_BLOCK, seed: int = 0) -> None:
        super().__init__(block_size)  # fp32 scales: the block absmax, unrounded, keeps it unbiased
        self.seed = int(seed)
        self.calls = 0

    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        _check(self, x, out)
        if x.numel() == 0:
            return
        keys = stochastic_keys(self.seed, self.calls)
        self.calls += 1
        if x.device.type == "cpu":
            cpu.onebit_encode(_as_f32_numpy(x), out.numpy(), self.block_size, keys=keys)
            return
        out.copy_(reference.onebit_stochastic_encode(x, self.block_size, *keys))


class Int8Codec(_BlockKernelCodec):
    """``int8``: blockwise absmax int8 (scale = absmax / 127 per block). ~3.9x at B=256 (fp32 scales)."""

    name = "int8"
    kernel = "int8"

    def wire_bytes(self, numel: int) -> int:
        return self.scale_bytes * self.num_blocks(numel) + numel


class Int4Codec(_BlockKernelCodec):
    """``int4``: blockwise absmax 4-bit (scale = absmax / 7, values -7..7, two per byte).
    ~7.1x at B=64 with bf16 scales.

    CPU float32: the C kernel (AVX2 encode, scalar decode) when built, else the
    vectorised PyTorch reference, which also serves every other device (no
    Triton kernel yet).
    """

    name = "int4"
    kernel = "int4"

    def wire_bytes(self, numel: int) -> int:
        return self.scale_bytes * self.num_blocks(numel) + (numel + 1) // 2

    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        _check(self, x, out)
        if x.numel() == 0:
            return
        if x.device.type == "cpu" and native.lib() is not None:
            native.int4_encode(_as_f32_numpy(x), out.numpy(), self.block_size, self.bf16)
            return
        out.copy_(reference.int4_encode(x, self.block_size, bf16=self.bf16))

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        if out.numel() == 0:
            return
        b, bf16 = self.block_size, self.bf16
        if out.device.type == "cpu" and native.lib() is not None:
            _decode_cpu(out, lambda o: native.int4_decode(payload.numpy(), o, b, bf16))
            return
        out.reshape(-1).copy_(reference.int4_decode(payload, out.numel(), b, bf16=bf16))


class Fp8Codec(Codec):
    """``fp8``: float8 e4m3 with one fp32 scale (absmax / 448) per block. ~3.9x at B=256.

    CPU float32: the C kernel, whose cast equals torch's ``float8_e4m3fn``
    conversion bit for bit (round to nearest even; saturated at +-448 first).
    Elsewhere, or without the C kernels: torch's conversion, in cache-sized pieces.
    """

    name = "fp8"
    _PIECE = 1 << 16

    def __init__(self, block_size: int = DEFAULT_BLOCK) -> None:
        super().__init__(block_size)
        if not hasattr(torch, "float8_e4m3fn"):
            raise CodecError(
                f"codec 'fp8' needs torch.float8_e4m3fn, which torch {torch.__version__} lacks",
                hint="use codec int8, or a torch release with float8 support (>= 2.1)",
            )

    def wire_bytes(self, numel: int) -> int:
        return 4 * self.num_blocks(numel) + numel

    def _pieces(self, n: int):
        piece = max(self.block_size, (self._PIECE // self.block_size) * self.block_size)
        for start in range(0, n, piece):
            yield start, min(n, start + piece)

    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        _check(self, x, out)
        n = x.numel()
        if n == 0:
            return
        if x.device.type == "cpu" and native.lib() is not None:
            native.fp8_encode(_as_f32_numpy(x), out.numpy(), self.block_size)
            return
        nb = self.num_blocks(n)
        flat = x.reshape(-1)
        for start, end in self._pieces(n):
            enc = reference.fp8_encode(flat[start:end], self.block_size)
            b0, nbc = start // self.block_size, -(-(end - start) // self.block_size)
            out[4 * b0 : 4 * (b0 + nbc)] = enc[: 4 * nbc]
            out[4 * nb + start : 4 * nb + end] = enc[4 * nbc :]

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        n = out.numel()
        if n == 0:
            return
        if out.device.type == "cpu" and native.lib() is not None:
            _decode_cpu(out, lambda o: native.fp8_decode(payload.numpy(), o, self.block_size))
            return
        nb = self.num_blocks(n)
        flat = out.reshape(-1)
        for start, end in self._pieces(n):
            b0, nbc = start // self.block_size, -(-(end - start) // self.block_size)
            piece = torch.cat([payload[4 * b0 : 4 * (b0 + nbc)], payload[4 * nb + start : 4 * nb + end]])
            flat[start:end] = reference.fp8_decode(piece, end - start, self.block_size)

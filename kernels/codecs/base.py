"""The codec interface: lossy (or exact) compression of a float tensor into bytes.

A codec turns a tensor into a flat ``uint8`` payload whose size depends only
on the element count (:meth:`Codec.wire_bytes`), so a receiver can size its
buffers from the split sizes alone and nothing but the payload travels.
Payload layout of the blockwise codecs: ``[fp32 scale per block][packed
values]`` (scales first, so they stay 4-byte aligned).

Three paths compute the same payload: a plain PyTorch reference
(``codecs.reference``), a cache-blocked numpy path for CPU tensors, and
a Triton kernel for CUDA tensors (``codecs.triton_gpu``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from hetrun.errors import HetrunError

__all__ = [
    "Codec",
    "CodecError",
    "Encoded",
    "ErrorFeedbackState",
    "NoneCodec",
]

DEFAULT_BLOCK = 256


class CodecError(HetrunError):
    """A codec got an input it cannot handle (wrong dtype, wrong payload size...)."""


@dataclass
class Encoded:
    """A payload plus what is needed to rebuild the tensor (only ``payload`` travels)."""

    payload: torch.Tensor  # uint8 [wire_bytes(numel)]
    shape: tuple[int, ...]
    dtype: torch.dtype
    codec: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return int(self.payload.numel())


@dataclass
class ErrorFeedbackState:
    """The residual an error-feedback codec carries from one step to the next.

    One per stream (e.g. per MoE layer, direction and peer). When the element
    count changes between steps (MoE split sizes vary), the overlapping prefix
    is kept and the rest starts at zero: the residual is a running correction,
    not tied to a particular token.
    """

    residual: torch.Tensor | None = None
    steps: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    def residual_for(self, numel: int, device: torch.device) -> torch.Tensor:
        r = self.residual
        if r is None or r.device != device:
            r = torch.zeros(numel, dtype=torch.float32, device=device)
        elif r.numel() != numel:
            grown = torch.zeros(numel, dtype=torch.float32, device=device)
            keep = min(numel, r.numel())
            grown[:keep] = r[:keep]
            r = grown
        self.residual = r
        return r


class Codec(ABC):
    """Compress float tensors to a byte payload of a size known from the element count."""

    name: str = ""
    #: True when decode(encode(x)) == x bit for bit.
    exact: bool = False
    #: True when encode takes an :class:`ErrorFeedbackState`.
    stateful: bool = False

    def __init__(self, block_size: int = DEFAULT_BLOCK) -> None:
        if block_size <= 0 or block_size % 8:
            raise CodecError(
                f"codec {self.name!r}: block_size {block_size} must be a positive multiple of 8",
                hint="use the default 256, or another multiple of 8 such as 128 or 1024",
            )
        self.block_size = int(block_size)

    # ----------------------------------------------------------- sizes
    def num_blocks(self, numel: int) -> int:
        return -(-numel // self.block_size)

    @abstractmethod
    def wire_bytes(self, numel: int) -> int:
        """Payload bytes for ``numel`` elements (the same on every rank)."""

    def ratio(self, numel: int = 1 << 20, itemsize: int = 4) -> float:
        """How many times smaller than the raw tensor (fp32 by default) the payload is."""
        return numel * itemsize / max(1, self.wire_bytes(numel))

    # ----------------------------------------------------------- raw interface
    @abstractmethod
    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        """Encode the contiguous 1-D tensor ``x`` into the uint8 tensor ``out`` (wire_bytes long)."""

    @abstractmethod
    def decode_into(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        """Decode ``payload`` into the contiguous 1-D float tensor ``out`` (its numel elements)."""

    # ----------------------------------------------------------- convenience
    def new_state(self) -> ErrorFeedbackState:
        return ErrorFeedbackState()

    def encode(self, x: torch.Tensor, state: ErrorFeedbackState | None = None) -> Encoded:
        if not x.is_floating_point():
            raise CodecError(
                f"codec {self.name!r}: cannot encode a {x.dtype} tensor",
                hint="codecs compress floating-point tensors (activations, gradients)",
            )
        flat = x.detach().contiguous().reshape(-1)
        out = torch.empty(self.wire_bytes(flat.numel()), dtype=torch.uint8, device=x.device)
        self.encode_into(flat, out, state)
        return Encoded(out, tuple(x.shape), x.dtype, self.name)

    def decode(self, enc: Encoded, out: torch.Tensor | None = None) -> torch.Tensor:
        expected = self.wire_bytes(enc.numel)
        if enc.payload.numel() != expected:
            raise CodecError(
                f"codec {self.name!r}: payload has {enc.payload.numel()} bytes, "
                f"{expected} expected for {enc.numel} elements",
                hint="decode with the codec (and block size) that encoded the payload",
            )
        if out is None:
            out = torch.empty(enc.shape, dtype=enc.dtype, device=enc.payload.device)
        self.decode_into(enc.payload, out.reshape(-1))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_size={self.block_size})"


class NoneCodec(Codec):
    """``none``: the raw bytes of the tensor; exact (the baseline)."""

    name = "none"
    exact = True

    def __init__(self, block_size: int = DEFAULT_BLOCK, itemsize: int = 4) -> None:
        super().__init__(block_size)
        self.itemsize = itemsize

    def wire_bytes(self, numel: int) -> int:
        return numel * self.itemsize

    def encode_into(
        self, x: torch.Tensor, out: torch.Tensor, state: ErrorFeedbackState | None = None
    ) -> None:
        if x.element_size() != self.itemsize:
            raise CodecError(
                f"codec 'none' was built for {self.itemsize}-byte elements, got {x.dtype}",
                hint=f"get_codec('none', itemsize={x.element_size()})",
            )
        out.copy_(x.view(torch.uint8))

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        out.view(torch.uint8).copy_(payload)

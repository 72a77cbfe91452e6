"""Lossless encoding of one chunk of tensor bytes.

Why byte planes: in fp32/bf16 weights and Adam moments the low mantissa bytes
are effectively random, while the sign/exponent byte has a handful of values.
Interleaved, zstd sees noise everywhere; grouped by byte position (plane),
the exponent plane compresses ~3x and the noisy planes can be stored raw
without spending compression time on them.

Why a per-plane XOR choice: XOR against the same chunk of the previous
checkpoint turns unchanged exponents into zero bytes (big win a few steps
later), but after ~100 steps only some planes still profit. Choosing per
plane (from a small sample) keeps the win where it exists and avoids a delta
dependency where it does not.

Encoded layout (the object payload): the concatenation of the per-plane
payloads; the header (a JSON dict built here, stored by ``objects``) records
for every plane its mode and byte length:
  ``"r"``  raw plane bytes            ``"z"``  zstd(plane)
  ``"xr"`` raw (plane XOR base plane)  ``"xz"`` zstd(plane XOR base plane)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zstandard
from hetrun.dag.errors import CheckpointError

ZSTD_LEVEL = 1
# Byte planes have few long matches; zstd's time goes into match search. A
# shallow search with long minimum matches leaves mostly Huffman-coded
# literals: measured ~1.5x faster than level 1 and slightly smaller on
# exponent planes (benchmarks/ckpt_codec_params.py).
ZSTD_PARAMS = zstandard.ZstdCompressionParameters(
    window_log=17, hash_log=8, chain_log=6, search_log=1, min_match=7,
    target_length=0, strategy=zstandard.STRATEGY_FAST,
)


def new_compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(compression_params=ZSTD_PARAMS)

# A plane is compressed only if a sample shrinks below this ratio; zstd on
# random bytes costs time and gains nothing.
COMPRESS_IF_BELOW = 0.95
# XOR is chosen for a plane only if it beats the plain plane by this factor:
# a delta makes restore depend on the base object, which costs restore time.
XOR_IF_BELOW = 0.97
SAMPLE_BYTES = 1 << 15
_UNPLANE_BLOCK_ROWS = 1 << 15

_PLANE_MODES = ("r", "z", "xr", "xz")


@dataclass
class Encoded:
    """An encoded chunk: header fields plus the payload parts to write in order."""

    itemsize: int
    planes: list[tuple[str, int]]  # (mode, stored byte length) per plane
    parts: list[bytes | memoryview]

    @property
    def uses_base(self) -> bool:
        return any(mode.startswith("x") for mode, _ in self.planes)

    @property
    def stored_len(self) -> int:
        return sum(n for _, n in self.planes)


def _planes(raw_u8: np.ndarray, itemsize: int) -> np.ndarray:
    """Byte planes (itemsize, n) of a uint8 array of whole items."""
    if itemsize == 1:
        return raw_u8.reshape(1, -1)
    return np.ascontiguousarray(raw_u8.reshape(-1, itemsize).T)


def _unplane_into(planes: list[np.ndarray], out_u8: np.ndarray) -> None:
    """Interleave byte planes back into ``out_u8`` (blocked: a whole-array
    strided write thrashes the cache and runs ~4x slower)."""
    itemsize = len(planes)
    if itemsize == 1:
        out_u8[:] = planes[0]
        return
    rows = out_u8.reshape(-1, itemsize)
    for start in range(0, rows.shape[0], _UNPLANE_BLOCK_ROWS):
        stop = start + _UNPLANE_BLOCK_ROWS
        block = rows[start:stop]
        for i, plane in enumerate(planes):
            block[:, i] = plane[start:stop]


def _sample(plane: np.ndarray) -> np.ndarray:
    """A sample taken from the middle (the start of a tensor is often atypical)."""
    if plane.size <= SAMPLE_BYTES:
        return plane
    mid = (plane.size - SAMPLE_BYTES) // 2
    return plane[mid : mid + SAMPLE_BYTES]


def encode(
    raw: np.ndarray,
    itemsize: int,
    base: np.ndarray | None = None,
    *,
    compressor: zstandard.ZstdCompressor | None = None,
) -> Encoded:
    """Encode ``raw`` (uint8, a multiple of ``itemsize`` long), optionally
    against ``base`` (the same chunk of the previous checkpoint, same length)."""
    if raw.size % itemsize:
        itemsize = 1  # a ragged tail chunk: treat as bytes
    cctx = compressor or new_compressor()
    planes = _planes(raw, itemsize)
    base_planes = (
        _planes(base, itemsize) if base is not None and base.size == raw.size else None
    )
    out_planes: list[tuple[str, int]] = []
    parts: list[bytes | memoryview] = []
    for i in range(itemsize):
        plane = planes[i]
        candidate = plane
        prefix = ""
        sample = _sample(plane)
        plain_est = len(cctx.compress(sample.tobytes())) / max(sample.size, 1)
        if base_planes is not None:
            xored = np.bitwise_xor(plane, base_planes[i])
            xs = _sample(xored)
            xor_est = len(cctx.compress(xs.tobytes())) / max(xs.size, 1)
            if xor_est < min(plain_est, 1.0) * XOR_IF_BELOW:
                candidate, prefix, plain_est = xored, "x", xor_est
        if plain_est < COMPRESS_IF_BELOW:
            z = cctx.compress(candidate.data)
            if len(z) < candidate.size:
                out_planes.append((prefix + "z", len(z)))
                parts.append(z)
                continue
        out_planes.append((prefix + "r", candidate.size))
        parts.append(memoryview(np.ascontiguousarray(candidate)).cast("B"))
    return Encoded(itemsize=itemsize, planes=out_planes, parts=parts)


def decode_into(
    payload: memoryview,
    itemsize: int,
    planes: list[tuple[str, int]],
    out: np.ndarray,
    base: np.ndarray | None,
    *,
    decompressor: zstandard.ZstdDecompressor | None = None,
) -> None:
    """Decode ``payload`` into ``out`` (uint8, the chunk's raw length).
    ``base`` is the decoded base chunk when any plane is an XOR delta."""
    if len(planes) != itemsize or out.size % itemsize:
        raise CheckpointError(
            f"chunk header lists {len(planes)} planes for item size {itemsize} and "
            f"{out.size} bytes; the object is corrupt",
            hint="run `hetrun ckpt verify RUN`; restore falls back to an older checkpoint",
        )
    dctx = decompressor or zstandard.ZstdDecompressor()
    plane_len = out.size // itemsize
    base_planes = _planes(base, itemsize) if base is not None else None
    decoded: list[np.ndarray] = []
    offset = 0
    for mode, stored in planes:
        if mode not in _PLANE_MODES:
            raise CheckpointError(f"unknown plane encoding {mode!r}; the object is corrupt")
        piece = payload[offset : offset + stored]
        offset += stored
        if len(piece) != stored:
            raise CheckpointError("chunk payload is truncated; the object is corrupt")
        if mode.endswith("z"):
            try:
                buf = dctx.decompress(piece, max_output_size=plane_len)
            except zstandard.ZstdError as exc:
                raise CheckpointError(f"chunk does not decompress ({exc}); the object is corrupt") from exc
            plane = np.frombuffer(buf, dtype=np.uint8)
        else:
            plane = np.frombuffer(piece, dtype=np.uint8)
        if plane.size != plane_len:
            raise CheckpointError(
                f"plane decodes to {plane.size} bytes, expected {plane_len}; the object is corrupt"
            )
        if mode.startswith("x"):
            if base_planes is None:
                raise CheckpointError("delta chunk without its base chunk")
            plane = np.bitwise_xor(plane, base_planes[len(decoded)])
        decoded.append(plane)
    if offset != len(payload):
        raise CheckpointError("chunk payload has trailing bytes; the object is corrupt")
    _unplane_into(decoded, out)

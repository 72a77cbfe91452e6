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

Why rotate (header ``"xf": "rotl1"``): fp32/bf16 words rotated left by one
bit before the split put the whole exponent in the top plane and the sign in
the lowest; the exponent plane then has fewer distinct values and the
mantissa planes lose nothing (benchmarks/ckpt_codec_params.py). Objects
without ``"xf"`` (the previous format) decode as before.

Why split the sign off (header ``"xf": "rotl1s"``, 4-byte items, a multiple
of 8 per chunk): after the rotation plane 0 holds the sign under 7 low
mantissa bits. Those 7 bits are noise; the sign is not (Adam's second moment
is never negative, a weight's sign rarely flips between checkpoints), and it
alone made plane 0 worth a Huffman pass over all its bytes. Packed apart
(``byteplanes.split_signs``), the 7 bits are stored raw and the signs are a
plane an eighth the size: same bytes, and neither the encoder nor a restore
spends time on plane 0.

Encoded layout (the object payload): the concatenation of the per-plane
payloads; the header (a JSON dict built here, stored by ``objects``) records
for every plane its mode and byte length:
  ``"r"``  raw plane bytes            ``"z"``  zstd(plane)
  ``"dr"`` raw (plane - base plane)    ``"dz"`` zstd(plane - base plane)
  ``"xr"`` raw (plane XOR base plane)  ``"xz"`` zstd(plane XOR base plane)
Differences are bytewise mod 256 within a plane. New objects use them
instead of XOR: an exponent that moves by one gives 0x01/0xFF, not a
varying bit pattern, and compresses ~5% better on the exponent plane and
up to ~10% on the next one (ckpt_codec_params.py); "x" modes still decode.
The split, the rotation and the XOR with the base run in one pass of the C
kernel ``hetrun.kernels.byteplanes`` (numpy fallback, same bytes); a delta
chain decodes in plane space (XOR planes in place, interleave once).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard
from hetrun.kernels import byteplanes
from hetrun.runtime.ckpt import zstd_direct

from hetrun.errors import CheckpointError

# Byte planes have few long matches; zstd's time goes into match search. A
# shallow search with long minimum matches leaves mostly Huffman-coded
# literals: measured ~1.5x faster than level 1 and slightly smaller on
# exponent planes (benchmarks/ckpt_codec_params.py).
ZSTD_PARAMS = zstandard.ZstdCompressionParameters(
    window_log=17, hash_log=8, chain_log=6, search_log=1, min_match=7,
    target_length=0, strategy=zstandard.STRATEGY_FAST,
)


# Where libzstd is reachable directly (zstd_direct): the same shallow search
# with a large acceleration, literals still Huffman-coded (python-zstandard
# cannot ask for both). On the 134M GPT's exponent planes: full 775 -> 967
# MB/s per thread at the same ratio; a delta 2 steps later 378 -> 731 MB/s
# and 0.204 -> 0.199, decoding 1.1 -> 2.1 GB/s; 100 steps later 0.359 ->
# 0.346. Plain zstd frames either way: both libraries decode both.
DIRECT_COMPRESS = True
ZSTD_ACCELERATION = 1024


def new_compressor() -> Any:
    """A compressor for one thread: ``.compress(buffer) -> bytes``."""
    if DIRECT_COMPRESS and zstd_direct.available():
        return zstd_direct.DirectCompressor(acceleration=ZSTD_ACCELERATION)
    return zstandard.ZstdCompressor(compression_params=ZSTD_PARAMS)

# A plane is compressed only if a sample shrinks below this ratio; zstd on
# random bytes costs time and gains nothing.
COMPRESS_IF_BELOW = 0.95
# XOR is chosen for a plane only if it beats the plain plane by this factor:
# a delta makes restore depend on the base object, which costs restore time.
XOR_IF_BELOW = 0.97
SAMPLE_BYTES = 1 << 15
# Rotate words before planing (see above); measured in ckpt_codec_params.py.
ROTATE = True
ROT_TAG = "rotl1"
# Split the sign bit off plane 0 where the rotation applies to 4-byte items (see above).
SIGN_SPLIT = True
SIGN_TAG = "rotl1s"
TRANSFORMS = (None, ROT_TAG, SIGN_TAG)

# Delta planes as bytewise differences (True) or XOR (False, the previous format).
DELTA_SUB = True

_PLANE_MODES = ("r", "z", "xr", "xz", "dr", "dz")


@dataclass
class Encoded:
    """An encoded chunk: header fields plus the payload parts to write in order."""

    itemsize: int
    planes: list[tuple[str, int]]  # (mode, stored byte length) per plane
    parts: list[bytes | memoryview]
    xf: str | None = None  # the transform: None, ROT_TAG or SIGN_TAG

    @property
    def uses_base(self) -> bool:
        return any(mode[0] in "xd" for mode, _ in self.planes)

    @property
    def stored_len(self) -> int:
        return sum(n for _, n in self.planes)


def object_header(enc: Encoded, raw_len: int, base: str | None = None, depth: int = 0) -> dict[str, Any]:
    """The object header of an encoded chunk (objects.py's file format): its planes and
    transform, and, for a delta, its base object's name and its depth in the chain."""
    header: dict[str, Any] = {"raw_len": int(raw_len), "itemsize": enc.itemsize,
                              "planes": [[m, n] for m, n in enc.planes]}
    if enc.xf:
        header["xf"] = enc.xf
    if enc.uses_base:
        header["base"] = base
    header["depth"] = depth if enc.uses_base else 0
    return header


class Scratch:
    """Reusable per-thread buffers (fresh memory costs a page fault per 4 KiB,
    which at GB/s rates is as slow as the work itself)."""

    def __init__(self) -> None:
        self._bufs: dict[object, np.ndarray] = {}

    def get(self, key: object, n: int) -> np.ndarray:
        b = self._bufs.get(key)
        if b is None or b.size < n:
            b = self._bufs[key] = np.empty(max(n, 1), dtype=np.uint8)
        return b[:n]


def rotates(itemsize: int, rot: bool) -> bool:
    return rot and itemsize in byteplanes.ROTATABLE


@dataclass(frozen=True)
class Layout:
    """How a chunk's bytes are arranged in planes: item size, transform
    (``None``, ``ROT_TAG`` or ``SIGN_TAG``) and every plane's length."""

    itemsize: int
    xf: str | None
    lengths: tuple[int, ...]

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.lengths, initial=0))[:-1]

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        return [flat[o : o + n] for o, n in zip(self.offsets, self.lengths, strict=True)]

    def split(self, raw: np.ndarray, out: np.ndarray, base: np.ndarray | None = None, mask: int = 0,
              sub: bool = False) -> None:
        """``raw``'s planes into ``out``; those in ``mask`` as deltas against ``base``."""
        if self.xf == SIGN_TAG:
            byteplanes.split_signs(raw, out, base=base if mask else None, mask=mask, sub=sub)
        elif mask:
            assert base is not None
            byteplanes.split_select(raw, self.itemsize, base, mask, out, rot=self.xf == ROT_TAG, sub=sub)
        else:
            byteplanes.split(raw, self.itemsize, out, rot=self.xf == ROT_TAG)

    def merge(self, planes: list[np.ndarray], out: np.ndarray) -> None:
        planes = [np.ascontiguousarray(p) for p in planes]
        if self.xf == SIGN_TAG:
            byteplanes.merge_signs(planes, out)
        else:
            byteplanes.merge(planes, out, rot=self.xf == ROT_TAG)


def layout_of(itemsize: int, nbytes: int, xf: str | None) -> Layout:
    """The layout an object header names; a :class:`CheckpointError` when it
    cannot describe a chunk of ``nbytes`` bytes."""
    if itemsize <= 0 or nbytes % itemsize or xf not in TRANSFORMS:
        raise CheckpointError(f"no plane layout for item size {itemsize}, {nbytes} bytes, transform {xf!r}; corrupt")
    n = nbytes // itemsize
    if xf == SIGN_TAG:
        if itemsize != 4 or n % 8:
            raise CheckpointError(f"the sign split needs 4-byte items in eights, not {n} of {itemsize}; corrupt")
        return Layout(4, xf, tuple(byteplanes.sign_split_lengths(n)))
    if xf == ROT_TAG and itemsize not in byteplanes.ROTATABLE:
        raise CheckpointError(f"item size {itemsize} cannot be rotated; corrupt")
    return Layout(itemsize, xf, (n,) * itemsize)


def choose_layout(itemsize: int, nbytes: int, rot: bool) -> Layout:
    """The layout the encoder writes for a chunk."""
    n = nbytes // itemsize
    if not rotates(itemsize, rot):
        return layout_of(itemsize, nbytes, None)
    if SIGN_SPLIT and itemsize == 4 and n % 8 == 0:
        return layout_of(itemsize, nbytes, SIGN_TAG)
    return layout_of(itemsize, nbytes, ROT_TAG)


def _sample_span(n: int, align: int) -> tuple[int, int]:
    """Items sampled for the choices: from the middle (the start of a tensor
    is often atypical), on ``align``-item boundaries (packed planes)."""
    if n <= SAMPLE_BYTES:
        return 0, n
    lo = (n - SAMPLE_BYTES) // 2 // align * align
    return lo, lo + SAMPLE_BYTES


def _sample_of(plane: np.ndarray, length: int, n: int, lo: int, hi: int) -> np.ndarray:
    """The part of a plane of ``length`` bytes that holds items [lo, hi) of ``n``."""
    return plane[lo * length // n : hi * length // n]


def _ratio(sample: np.ndarray) -> float:
    return byteplanes.estimate(sample) / max(sample.size, 1)


def _choose(raw: np.ndarray, base: np.ndarray, lay: Layout, sub: bool,
            scratch: Scratch) -> tuple[int, list[float]]:
    """Which planes to store as deltas (a bit mask) and every chosen plane's
    estimated ratio, from the sampled items of ``raw`` and ``base``: only
    the chosen form of each plane is then written."""
    size = lay.itemsize
    lo, hi = _sample_span(raw.size // size, 8)
    sl = layout_of(size, (hi - lo) * size, lay.xf)
    sp = scratch.get("sample_planes", (hi - lo) * size)
    sx = scratch.get("sample_deltas", (hi - lo) * size)
    part, part_base = raw[lo * size : hi * size], base[lo * size : hi * size]
    sl.split(part, sp)
    sl.split(part, sx, part_base, (1 << len(sl.lengths)) - 1, sub)
    mask, ests = 0, []
    for i, (plain_s, delta_s) in enumerate(zip(sl.views(sp), sl.views(sx), strict=True)):
        plain, delta = _ratio(plain_s), _ratio(delta_s)
        # A delta that would still be stored raw gains nothing over the plain
        # raw plane and makes restore read the base: plain then.
        if delta < min(plain, 1.0) * XOR_IF_BELOW and delta < COMPRESS_IF_BELOW:
            mask |= 1 << i
            ests.append(delta)
        else:
            ests.append(plain)
    return mask, ests


def _compress(cctx: Any, plane: np.ndarray, scratch: Scratch, i: int) -> bytes | memoryview:
    """``plane`` compressed; with libzstd directly, into the scratch (no copy
    into a new bytes object: ~0.6 GB of copies for a 1.6 GB delta)."""
    into = getattr(cctx, "compress_into", None)
    if into is None:
        return cctx.compress(plane.data)
    buf = scratch.get(("z", i), cctx.bound(plane.size))
    return buf[: into(plane.data, buf)].data


def encode(
    raw: np.ndarray,
    itemsize: int,
    base: np.ndarray | None = None,
    *,
    compressor: Any = None,
    rot: bool | None = None,
    sub: bool | None = None,
    scratch: Scratch | None = None,
) -> Encoded:
    """Encode ``raw`` (uint8, a multiple of ``itemsize`` long), optionally
    against ``base`` (the same chunk of the previous checkpoint, same length).
    With ``scratch``, the planes in ``parts`` (raw or compressed) point into
    its buffers: write them out before the next encode with the same scratch."""
    if raw.size % itemsize:
        itemsize = 1  # a ragged tail chunk: treat as bytes
    lay = choose_layout(itemsize, raw.size, ROTATE if rot is None else rot)
    sub = DELTA_SUB if sub is None else sub
    cctx = compressor or new_compressor()
    scratch = scratch or Scratch()
    n = raw.size // itemsize
    planes = scratch.get("planes", raw.size)
    mask = 0
    if base is not None and base.size == raw.size:
        mask, ests = _choose(raw, base, lay, sub, scratch)
    lay.split(raw, planes, base, mask, sub)
    if not mask:
        lo, hi = _sample_span(n, 8)
        ests = [_ratio(_sample_of(p, len(p), n, lo, hi)) for p in lay.views(planes)]
    prefix = "d" if sub else "x"
    out_planes: list[tuple[str, int]] = []
    parts: list[bytes | memoryview] = []
    demoted = 0  # delta planes stored plain after all (their bytes live in the "plain" scratch)
    for i, plane in enumerate(lay.views(planes)):
        delta = (mask >> i) & 1
        if ests[i] < COMPRESS_IF_BELOW:
            z = _compress(cctx, plane, scratch, i)
            if len(z) < plane.size:
                out_planes.append((prefix + "z" if delta else "z", len(z)))
                parts.append(z)
                continue
            if delta:
                # The sample promised more than the plane gave: stored raw, the
                # delta would only make restore read the base. The plain plane.
                # Every plane demoted so far stays plain in this split: the
                # parts already taken point into the same scratch.
                demoted |= 1 << i
                plain = scratch.get("plain", raw.size)
                lay.split(raw, plain, base, mask & ~demoted, sub)
                plane = lay.views(plain)[i]
        out_planes.append(("r", plane.size))
        parts.append(plane.data.cast("B"))
    return Encoded(itemsize=itemsize, planes=out_planes, parts=parts, xf=lay.xf)


def decode_planes(
    payload: memoryview,
    lay: Layout,
    planes: list[tuple[str, int]],
    base_planes: list[np.ndarray] | None,
    *,
    decompressor: zstandard.ZstdDecompressor | None = None,
    scratch: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The planes of a chunk laid out as ``lay``, still in plane space.
    ``base_planes``: the base chunk's planes in the same layout, needed when
    any plane is a delta; a writable base plane is updated in place (the
    caller gives up those arrays), a read-only one into ``scratch`` (the
    chunk's length). Returned planes may be views of ``payload``."""
    dctx = decompressor or zstandard.ZstdDecompressor()
    decoded: list[np.ndarray] = []
    stored_at = plane_offsets(len(payload), planes, lay)
    for i, ((mode, stored), at, plane_len, start) in enumerate(
            zip(planes, stored_at, lay.lengths, lay.offsets, strict=True)):
        piece = payload[at : at + stored]
        bp = None
        if mode[0:1] in ("x", "d"):
            if base_planes is None or len(base_planes) != len(lay.lengths):
                raise CheckpointError("delta chunk without its base chunk")
            bp = base_planes[i]
            if not bp.flags.writeable and scratch is None:
                scratch = np.empty(sum(lay.lengths), dtype=np.uint8)
        target = None if scratch is None else scratch[start : start + plane_len]
        decoded.append(decode_plane(piece, mode, stored, plane_len, bp, decompressor=dctx, target=target))
    return decoded


def plane_offsets(payload_len: int, planes: list[tuple[str, int]], lay: Layout) -> list[int]:
    """Start of every plane in the payload, after checking the header's plane
    table against the layout: what lets a restore decode one plane alone."""
    if len(planes) != len(lay.lengths):
        raise CheckpointError(
            f"chunk header lists {len(planes)} planes where its layout has {len(lay.lengths)} "
            f"(item size {lay.itemsize}, transform {lay.xf!r}); the object is corrupt",
            hint="run `hetrun ckpt verify RUN`; restore falls back to an older checkpoint",
        )
    offsets, off = [], 0
    for mode, stored in planes:
        if mode not in _PLANE_MODES or stored < 0:
            raise CheckpointError(f"unknown plane encoding {mode!r}; the object is corrupt")
        offsets.append(off)
        off += stored
    if off > payload_len:
        raise CheckpointError("chunk payload is truncated; the object is corrupt")
    if off != payload_len:
        raise CheckpointError("chunk payload has trailing bytes; the object is corrupt")
    return offsets


def decode_plane(
    piece: memoryview,
    mode: str,
    stored: int,
    plane_len: int,
    base_plane: np.ndarray | None,
    *,
    decompressor: zstandard.ZstdDecompressor,
    target: np.ndarray | None = None,
    zbuf: np.ndarray | None = None,
    direct: Any = None,
) -> np.ndarray:
    """One plane (``plane_len`` bytes, plane space) from its stored ``piece``.
    A delta plane needs ``base_plane`` (the base chunk's same plane): a
    writable one is updated in place (the caller gives it up), a read-only one
    into ``target``. The result may be a view of ``piece`` or ``target``.
    With ``target`` and ``zbuf`` (``plane_len`` bytes each, reused by the
    caller), a compressed plane decompresses into them instead of fresh
    memory: in a fresh process that memory costs a page fault per 4 KiB.
    ``direct`` (a :class:`zstd_direct.DirectDecompressor`) decodes into them in
    one pass instead of through zstandard's streaming copy."""
    if mode not in _PLANE_MODES:
        raise CheckpointError(f"unknown plane encoding {mode!r}; the object is corrupt")
    if len(piece) != stored:
        raise CheckpointError("chunk payload is truncated; the object is corrupt")
    if mode.endswith("z"):
        into = zbuf if mode[0] in "xd" else target
        plane = _decompress(piece, plane_len, decompressor, into, direct)
    else:
        plane = np.frombuffer(piece, dtype=np.uint8)
    if plane.size != plane_len:
        raise CheckpointError(
            f"plane decodes to {plane.size} bytes, expected {plane_len}; the object is corrupt"
        )
    if mode[0] not in "xd":
        return plane
    if base_plane is None or base_plane.size != plane_len:
        raise CheckpointError("delta chunk without its base chunk")
    if base_plane.flags.writeable:
        out = base_plane
    else:
        if target is None:
            target = np.empty(plane_len, dtype=np.uint8)
        out = target
    if mode[0] == "x":
        return np.bitwise_xor(base_plane, plane, out=out)
    return np.add(base_plane, plane, out=out)  # uint8 addition wraps: inverts the mod-256 difference


def _decompress(piece: memoryview, plane_len: int, dctx: zstandard.ZstdDecompressor,
                into: np.ndarray | None, direct: Any = None) -> np.ndarray:
    if direct is not None and into is not None and into.size == plane_len:
        try:
            got = direct.decompress_into(piece, into)
        except ValueError as exc:
            raise CheckpointError(f"chunk does not decompress ({exc}); the object is corrupt") from exc
        if got != plane_len:
            raise CheckpointError(f"plane decodes to {got} bytes, expected {plane_len}; the object is corrupt")
        return into
    try:
        if into is None or into.size != plane_len:
            return np.frombuffer(dctx.decompress(piece, max_output_size=plane_len), dtype=np.uint8)
        view = into.data.cast("B")
        got = 0
        with dctx.stream_reader(piece, read_size=max(len(piece), 1), read_across_frames=False) as reader:
            while got < plane_len:
                n = reader.readinto(view[got:])
                if not n:
                    break
                got += n
            extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise CheckpointError(f"chunk does not decompress ({exc}); the object is corrupt") from exc
    if got != plane_len or extra:
        raise CheckpointError(
            f"plane decodes to {'more than ' if extra else ''}{got} bytes, expected {plane_len}; the object is corrupt"
        )
    return into


"""Byte-plane split/merge for checkpoint chunks: a C kernel (``csrc/byteplanes.c``)
with a numpy fallback that gives identical bytes.

Why C: numpy can only do the (items, itemsize) -> (itemsize, items) transpose
as a strided copy, ~0.5 GB/s here even when blocked for the cache; the AVX2
kernel does the transpose, the optional one-bit rotation and the delta
against a base chunk in one pass at memory speed. Built at first use with
``cc -O3 -march=native`` into ``$HETRUN_KERNEL_CACHE`` (default
``~/.cache/hetrun``), keyed by source and CPU like ``codecs.native``. No
compiler, or ``HETRUN_NATIVE_CODECS=0``: the numpy path.

Transform ``rot``: each 2/4/8-byte little-endian word rotated left by one bit
before the split (sign to bit 0, the whole fp32/bf16 exponent in the top
byte). It commutes with XOR, so a delta of rotated planes is exact.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from hetrun.kernels.native_build import NativeLibrary

__all__ = ["ROTATABLE", "estimate", "merge", "merge_signs", "native", "sign_split_lengths", "split",
           "split_select", "split_signs"]

ROTATABLE = (2, 4, 8)
_SRC = Path(__file__).with_name("csrc") / "byteplanes.c"
_WORD = {2: np.uint16, 4: np.uint32, 8: np.uint64}




def _declare(dll: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    dll.hr_bp_split.argtypes = [p, i64, i32, i32, p]
    dll.hr_bp_split.restype = None
    dll.hr_bp_merge.argtypes = [ctypes.POINTER(p), i64, i32, i32, p]
    dll.hr_bp_merge.restype = None
    dll.hr_bp_split_select.argtypes = [p, p, i64, i32, i32, i32, ctypes.c_uint32, p]
    dll.hr_bp_split_select.restype = None
    dll.hr_bp_estimate.argtypes = [p, i64]
    dll.hr_bp_estimate.restype = ctypes.c_double
    dll.hr_bp_split_s.argtypes = [p, p, i64, i32, ctypes.c_uint32, p]
    dll.hr_bp_split_s.restype = None
    dll.hr_bp_merge_s.argtypes = [ctypes.POINTER(p), i64, p]
    dll.hr_bp_merge_s.restype = None


_native = NativeLibrary("byteplanes", _SRC, compile_flags=["-O3", "-march=native"],
                        disable_env="HETRUN_NATIVE_CODECS", declare=_declare)


def native() -> ctypes.CDLL | None:
    """The loaded kernel, or None (no compiler, or HETRUN_NATIVE_CODECS=0)."""
    return _native.load()


def _check(a: np.ndarray, n: int, what: str) -> None:
    if a.dtype != np.uint8 or not a.flags.c_contiguous or a.size < n:
        raise ValueError(f"byteplanes: {what} must be a contiguous uint8 array of at least {n} bytes")


def _rotated(raw: np.ndarray, itemsize: int, rot: bool, left: bool) -> np.ndarray:
    if not rot:
        return raw
    w = raw.view(_WORD[itemsize])
    bits = itemsize * 8
    r = (w << 1) | (w >> (bits - 1)) if left else (w >> 1) | (w << (bits - 1))
    return r.astype(_WORD[itemsize], copy=False).view(np.uint8)


def split(raw: np.ndarray, itemsize: int, planes: np.ndarray, *, rot: bool = False,
          base: np.ndarray | None = None, xplanes: np.ndarray | None = None,
          sub: bool = False, use_native: bool = True) -> None:
    """Write the byte planes of ``raw`` (uint8, whole items) into ``planes``
    (uint8, ``raw.size`` bytes, plane p at ``[p * items:(p + 1) * items]``); with
    ``base`` (same length) also the delta planes into ``xplanes``: each plane
    byte XOR the base's (``sub=False``) or minus it, mod 256 (``sub=True``).
    The encoder writes one form per plane (:func:`split_select`); both forms
    are for tests and the numpy fallback of :func:`split_select`."""
    n = raw.size // itemsize
    if raw.size % itemsize or (rot and itemsize not in ROTATABLE):
        raise ValueError(f"byteplanes: {raw.size} bytes / item size {itemsize} (rot={rot}) is not splittable")
    _check(raw, raw.size, "raw")
    _check(planes, raw.size, "planes")
    if base is not None:
        _check(base, raw.size, "base")
        if xplanes is None:
            raise ValueError("byteplanes: base given without xplanes")
        _check(xplanes, raw.size, "xplanes")
    dll = native() if use_native else None
    if dll is not None:
        if base is None:
            dll.hr_bp_split(raw.ctypes.data, n, itemsize, int(rot), planes.ctypes.data)
        else:  # both forms: what the kernel writes one plane at a time
            split_select(raw, itemsize, base, 0, planes, rot=rot, sub=sub)
            split_select(raw, itemsize, base, (1 << itemsize) - 1, xplanes, rot=rot, sub=sub)  # type: ignore[arg-type]
        return
    src = _rotated(raw[: n * itemsize], itemsize, rot, left=True)
    planes[: raw.size].reshape(itemsize, n)[:] = src.reshape(n, itemsize).T
    if base is not None and xplanes is not None:
        b = _rotated(base[: n * itemsize], itemsize, rot, left=True)
        xp = xplanes[: raw.size].reshape(itemsize, n)
        xp[:] = b.reshape(n, itemsize).T
        if sub:
            np.subtract(planes[: raw.size].reshape(itemsize, n), xp, out=xp)
        else:
            np.bitwise_xor(xp, planes[: raw.size].reshape(itemsize, n), out=xp)


def split_select(raw: np.ndarray, itemsize: int, base: np.ndarray, mask: int, planes: np.ndarray, *,
                 rot: bool = False, sub: bool = False, use_native: bool = True) -> None:
    """Like :func:`split` with ``base``, into one buffer: plane p is the delta
    plane where bit p of ``mask`` is set, else the plain plane. What the
    encoder writes once it has chosen each plane's form from a sample: half
    the memory traffic of writing both forms."""
    n = raw.size // itemsize
    if raw.size % itemsize or (rot and itemsize not in ROTATABLE):
        raise ValueError(f"byteplanes: {raw.size} bytes / item size {itemsize} (rot={rot}) is not splittable")
    _check(raw, raw.size, "raw")
    _check(base, raw.size, "base")
    _check(planes, raw.size, "planes")
    dll = native() if use_native else None
    if dll is not None:
        dll.hr_bp_split_select(raw.ctypes.data, base.ctypes.data, n, itemsize, int(rot), int(sub),
                               mask & 0xFFFFFFFF, planes.ctypes.data)
        return
    plain = np.empty(raw.size, np.uint8)
    delta = np.empty(raw.size, np.uint8)
    split(raw, itemsize, plain, rot=rot, base=base, xplanes=delta, sub=sub, use_native=False)
    for i in range(itemsize):
        src = delta if (mask >> i) & 1 else plain
        planes[i * n : (i + 1) * n] = src[i * n : (i + 1) * n]


def estimate(plane: np.ndarray, *, use_native: bool = True) -> float:
    """Bytes a Huffman coder (zstd's literal coder) would need for ``plane``,
    from its byte histogram: each byte value of frequency f costs -log2(f)
    bits, bounded to zstd's code lengths (1 to 11 bits), plus a table and
    headers per 128 KiB block; one repeated value costs a few bytes (an RLE
    block); a flat histogram stays raw, as zstd itself decides. Several
    times cheaper than compressing a sample and close to it (codec.py uses
    it to choose plane forms)."""
    if plane.size == 0:
        return 0.0
    dll = native() if use_native else None
    if dll is not None and plane.dtype == np.uint8 and plane.flags.c_contiguous:
        return float(dll.hr_bp_estimate(plane.ctypes.data, plane.size))
    counts = np.bincount(np.ascontiguousarray(plane, dtype=np.uint8), minlength=256).astype(np.float64)
    used = counts[counts > 0]
    if used.size == 1:
        return 8.0
    if used.max() <= (plane.size >> 7) + 4:  # zstd keeps a flat histogram raw (HUF_compress)
        return float(plane.size)
    lengths = np.clip(np.log2(plane.size / used), 1.0, 11.0)
    blocks = -(-plane.size // (1 << 17))
    return float(np.dot(used, lengths)) / 8.0 + blocks * (16.0 + 0.5 * used.size)


def merge(planes: list[np.ndarray], out: np.ndarray, *, rot: bool = False, use_native: bool = True) -> None:
    """Interleave ``planes`` (one uint8 array of ``out.size / len(planes)`` bytes
    per byte position) into ``out``, undoing ``rot``: the inverse of :func:`split`."""
    itemsize = len(planes)
    n = out.size // max(itemsize, 1)
    if itemsize == 0 or out.size % itemsize or (rot and itemsize not in ROTATABLE):
        raise ValueError(f"byteplanes: {len(planes)} planes do not tile {out.size} bytes (rot={rot})")
    _check(out, out.size, "out")
    for p in planes:
        _check(p, n, "plane")
    dll = native() if use_native else None
    if dll is not None:
        ptrs = (ctypes.c_void_p * itemsize)(*[p.ctypes.data for p in planes])
        dll.hr_bp_merge(ptrs, n, itemsize, int(rot), out.ctypes.data)
        return
    rows = out.reshape(n, itemsize)
    # Blocked: a whole-array strided write thrashes the cache (~4x slower).
    block = 1 << 15
    for start in range(0, n, block):
        stop = min(n, start + block)
        for i, p in enumerate(planes):
            rows[start:stop, i] = p[start:stop]
        if rot:
            seg = rows[start:stop].reshape(-1)
            seg[:] = _rotated(seg, itemsize, rot, left=False)


# -- the sign split (layout "rotl1s", 4-byte items; see csrc/byteplanes.c) -----------

def sign_split_lengths(n: int) -> list[int]:
    """Plane lengths for ``n`` 4-byte items (``n % 8 == 0``): the 7 low mantissa
    bits packed, byte 1, byte 2, the exponent, the signs packed."""
    if n % 8:
        raise ValueError(f"byteplanes: the sign split needs a multiple of 8 items, got {n}")
    return [n // 8 * 7, n, n, n, n // 8]


def _pack_plane0(p0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bits = np.unpackbits(p0.reshape(-1, 1), axis=1, bitorder="little")
    return np.packbits(bits[:, 1:].reshape(-1), bitorder="little"), np.packbits(bits[:, 0], bitorder="little")


def split_signs(raw: np.ndarray, out: np.ndarray, *, base: np.ndarray | None = None, mask: int = 0,
                sub: bool = False, use_native: bool = True) -> None:
    """The rotated byte planes of ``raw`` (4-byte items, a multiple of 8 of
    them) with plane 0 split into packed low mantissa bits and packed signs,
    into ``out`` (``raw.size`` bytes, planes in the order of
    :func:`sign_split_lengths`). With ``base``, the planes whose bit is set in
    ``mask`` (bit 0: low bits, 1-3: byte planes, 4: signs) are deltas against
    ``base``'s: XOR, or bytewise differences mod 256 with ``sub``."""
    if raw.size % 4:
        raise ValueError(f"byteplanes: {raw.size} bytes are not whole 4-byte items")
    n = raw.size // 4
    lengths = sign_split_lengths(n)
    _check(raw, raw.size, "raw")
    _check(out, raw.size, "out")
    if mask and base is None:
        raise ValueError("byteplanes: a delta mask without a base")
    if base is not None:
        _check(base, raw.size, "base")
    dll = native() if use_native else None
    if dll is not None:
        dll.hr_bp_split_s(raw.ctypes.data, None if base is None else base.ctypes.data, n, int(sub),
                          mask & 0x1F, out.ctypes.data)
        return

    def planes_of(words: np.ndarray) -> list[np.ndarray]:
        flat = np.empty(words.size, np.uint8)
        split(words, 4, flat, rot=True, use_native=False)
        low, signs = _pack_plane0(flat[:n])
        return [low, flat[n : 2 * n], flat[2 * n : 3 * n], flat[3 * n :], signs]

    mine = planes_of(raw)
    theirs = planes_of(base) if base is not None and mask else None
    off = 0
    for i, length in enumerate(lengths):
        if theirs is not None and (mask >> i) & 1:
            op = np.subtract if sub else np.bitwise_xor
            out[off : off + length] = op(mine[i], theirs[i])
        else:
            out[off : off + length] = mine[i]
        off += length


def merge_signs(planes: list[np.ndarray], out: np.ndarray, *, use_native: bool = True) -> None:
    """The inverse of :func:`split_signs` (no deltas): five planes into ``out``."""
    n = out.size // 4
    if out.size % 4 or len(planes) != 5:
        raise ValueError(f"byteplanes: {len(planes)} planes do not make the sign split of {out.size} bytes")
    lengths = sign_split_lengths(n)
    _check(out, out.size, "out")
    for p, length in zip(planes, lengths, strict=True):
        _check(p, length, "plane")
    dll = native() if use_native else None
    if dll is not None:
        ptrs = (ctypes.c_void_p * 5)(*[p.ctypes.data for p in planes])
        dll.hr_bp_merge_s(ptrs, n, out.ctypes.data)
        return
    low = np.unpackbits(planes[0][: lengths[0]], bitorder="little").reshape(n, 7)
    signs = np.unpackbits(planes[4][: lengths[4]], bitorder="little").reshape(n, 1)
    p0 = np.packbits(np.concatenate([signs, low], axis=1), axis=1, bitorder="little").reshape(-1)
    merge([p0, planes[1][:n], planes[2][:n], planes[3][:n]], out, rot=True, use_native=False)

"""The CPU codecs: the single-pass C kernels when built, else cache-blocked numpy.

``native`` (C, one pass per block) serves every codec here when a C
compiler is present; the numpy versions below serve them where there is none
(``HETRUN_NATIVE_CODECS=0``), and write the same bytes.

Why this shape: at 64 MB a whole-array temporary costs more in page faults
than the arithmetic, and naive torch versions run at 0.05-0.25x memcpy. Each
function walks its input in pieces of ``CHUNK`` elements (a few hundred KB,
so every temporary stays in L2), writes straight into the caller's payload or
output, and reuses per-thread scratch buffers. Results equal
``reference`` bit for bit except 1-bit scales, whose block sums may
round differently (summation order).

Decoding a sign code uses the float layout: ``-s`` and ``s`` differ only in
the sign bit, so a decoded block is the scale's bit pattern OR'ed with the
sign bits moved to bit 31 (a table lookup from packed bytes), with no
multiply and no ``where``.
"""

from __future__ import annotations

import threading

import numpy as np

from . import native

INT8_MAX = np.float32(127.0)

#: Elements per piece: 32 Ki fp32 = 128 KiB of input; with scratch ~0.5 MiB, inside L2.
CHUNK = 32768

# SIGN_TABLE[b] holds the 8 sign masks (bit j of byte b moved to bit 31) as uint32.
_SIGN_TABLE = (
    ((np.arange(256, dtype=np.uint32)[:, None] >> np.arange(8, dtype=np.uint32)) & 1) << 31
).astype(np.uint32)


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.f32a = np.empty(CHUNK, dtype=np.float32)
        self.f32b = np.empty(CHUNK, dtype=np.float32)
        self.f32c = np.empty(CHUNK, dtype=np.float32)
        self.u32 = np.empty(CHUNK, dtype=np.uint32)
        self.bool_ = np.empty(CHUNK, dtype=np.bool_)
        self.sc = np.empty(CHUNK // 8, dtype=np.float32)  # per-block scales of one piece


_scratch = _Scratch()


def _chunk_for(block: int) -> int:
    # A whole number of blocks per piece (and of bytes of sign bits).
    return max(block, (CHUNK // block) * block)


def _scratch_for(chunk: int) -> _Scratch:
    s = _scratch
    if s.f32a.size < chunk:
        s.f32a = np.empty(chunk, dtype=np.float32)
        s.f32b = np.empty(chunk, dtype=np.float32)
        s.f32c = np.empty(chunk, dtype=np.float32)
        s.u32 = np.empty(chunk, dtype=np.uint32)
        s.bool_ = np.empty(chunk, dtype=np.bool_)
        s.sc = np.empty(chunk // 8, dtype=np.float32)
    return s


def wire_split(out: np.ndarray, n: int, block: int, bf16: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The scales (float32, or the uint16 bf16 bits) and the values of a payload."""
    nb = -(-n // block)
    if bf16:
        return out[: 2 * nb].view(np.uint16), out[2 * nb :]
    return out[: 4 * nb].view(np.float32), out[4 * nb :]


def _bf16_round(sc: np.ndarray) -> None:
    """Round float32 ``sc`` in place to bf16 (nearest even), as the C kernels' bf16_round."""
    u = sc.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)


def _scales_out(scales: np.ndarray, b0: int, nbc: int, s: _Scratch) -> np.ndarray:
    """Where a piece's float32 scales are computed: the payload itself (fp32) or scratch (bf16)."""
    return scales[b0 : b0 + nbc] if scales.dtype == np.float32 else s.sc[:nbc]


def _scales_store(scales: np.ndarray, b0: int, sc: np.ndarray) -> None:
    if scales.dtype != np.float32:
        scales[b0 : b0 + sc.size] = sc.view(np.uint32) >> np.uint32(16)


def _scales_in(scales: np.ndarray, b0: int, nbc: int, s: _Scratch) -> np.ndarray:
    """A piece's scales as float32 (bf16 bits widened into scratch)."""
    if scales.dtype == np.float32:
        return scales[b0 : b0 + nbc]
    sc = s.sc[:nbc]
    sc.view(np.uint32)[:] = scales[b0 : b0 + nbc].astype(np.uint32) << np.uint32(16)
    return sc


def _padded(xc: np.ndarray, buf: np.ndarray, block: int) -> np.ndarray:
    """The last, partial piece copied into ``buf`` and zero-padded to whole blocks."""
    m = xc.size
    mp = -(-m // block) * block
    buf[:m] = xc
    buf[m:mp] = 0.0
    return buf[:mp]


def onebit_encode(
    x: np.ndarray,
    out: np.ndarray,
    block: int,
    residual: np.ndarray | None = None,
    keys: tuple[int, int] | None = None,
    bf16: bool = False,
) -> None:
    """Sign bits + per-block scale of ``x`` into ``out``.

    ``residual`` (error feedback): encode ``x + residual`` and leave in
    ``residual`` what the code lost. ``keys`` (stochastic): scale = block absmax
    and signs drawn, from the counter-based generator keyed by ``keys``, so the
    decoded value is unbiased. ``bf16``: scales travel as bf16 (not with ``keys``).
    """
    if native.lib() is not None:
        if keys is None:
            native.onebit_encode(x, out, block, residual, bf16)
        else:
            native.onebit_stochastic_encode(x, out, block, keys)
        return
    # Longer than most functions on purpose: one loop over cache-sized chunks in which a
    # piece is scaled, signed, packed and its residual taken while it is still in cache.
    n = x.size
    scales, bits = wire_split(out, n, block, bf16)
    chunk = _chunk_for(block)
    s = _scratch_for(chunk)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        m = end - start
        xc = x[start:end]
        if residual is not None:
            c = s.f32c[:m]
            np.add(xc, residual[start:end], out=c)
            xc = c
        partial = m % block != 0
        xb = _padded(xc, s.f32b, block) if partial else xc
        mp = xb.size
        nbc = mp // block
        b0 = start // block
        absx = s.f32a[:mp]
        np.abs(xb, out=absx)
        sc = _scales_out(scales, b0, nbc, s)
        if keys is None:
            np.add.reduce(absx.reshape(nbc, block), axis=1, out=sc)
            if partial:
                counts = np.full(nbc, block, dtype=np.float32)
                counts[-1] = m - (nbc - 1) * block
                np.divide(sc, counts, out=sc)
            else:
                sc *= np.float32(1.0 / block)
            if bf16:
                _bf16_round(sc)
                _scales_store(scales, b0, sc)
            neg = s.bool_[:m]
            np.signbit(xc, out=neg)
        else:
            np.maximum.reduce(absx.reshape(nbc, block), axis=1, out=sc)
            # negative iff x < M * (1 - u24 * 2^-23), u24 as reference.stochastic_uniform24
            u = s.f32a[:mp]
            u[:] = _uniform24(start, mp, keys)
            np.multiply(u, np.float32(-(2.0**-23)), out=u)
            u += np.float32(1.0)
            np.multiply(u.reshape(nbc, block), sc[:, None], out=u.reshape(nbc, block))
            neg = s.bool_[:m]
            np.less(xc, u[:m], out=neg)
        bits[start // 8 : (end + 7) // 8] = np.packbits(neg, bitorder="little")
        if residual is not None:
            # residual = c - decode(c), computed while the piece is still in cache
            dec = s.f32a[:mp]
            _decode_piece(bits[start // 8 : (end + 7) // 8], sc, block, mp, dec, s)
            np.subtract(xc, dec[:m], out=residual[start:end])


def _lowbias32(x: np.ndarray) -> np.ndarray:
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)  # uint32 arrays wrap mod 2^32, as the C code
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def _uniform24(start: int, m: int, keys: tuple[int, int]) -> np.ndarray:
    """u24 of elements ``start .. start + m`` (reference.stochastic_uniform24)."""
    k0, k1 = np.uint32(keys[0]), np.uint32(keys[1])
    if (start >> 32) == ((start + m) >> 32):  # one high word for the whole piece
        lo = np.arange(start & 0xFFFFFFFF, (start & 0xFFFFFFFF) + m, dtype=np.uint64).astype(np.uint32)
        k0 = np.uint32((keys[0] + (start >> 32) * 0x9E3779B9) & 0xFFFFFFFF)
    else:
        i = np.arange(start, start + m, dtype=np.uint64)
        lo = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        lo += (i >> np.uint64(32)).astype(np.uint32) * np.uint32(0x9E3779B9)
    h = _lowbias32(lo + k0)
    h ^= k1
    return h >> np.uint32(8)


def _decode_piece(
    bits: np.ndarray, sc: np.ndarray, block: int, mp: int, dst: np.ndarray, s: _Scratch
) -> None:
    """Decode ``mp`` (whole blocks) elements into float32 ``dst``; ``bits`` may be shorter."""
    nbytes = bits.size
    masks = s.u32[:mp]
    np.take(_SIGN_TABLE, bits, axis=0, out=masks[: nbytes * 8].reshape(nbytes, 8))
    if nbytes * 8 < mp:
        masks[nbytes * 8 :] = 0
    nbc = mp // block
    np.bitwise_or(
        masks.reshape(nbc, block),
        sc.view(np.uint32)[:, None],
        out=dst.view(np.uint32).reshape(nbc, block),
    )


def onebit_decode(payload: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    if native.lib() is not None:
        native.onebit_decode(payload, out, block, bf16)
        return
    n = out.size
    scales, bits = wire_split(payload, n, block, bf16)
    chunk = _chunk_for(block)
    s = _scratch_for(chunk)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        m = end - start
        b0 = start // block
        if m % block == 0:
            nbc = m // block
            _decode_piece(
                bits[start // 8 : end // 8], _scales_in(scales, b0, nbc, s), block, m, out[start:end], s
            )
        else:
            mp = -(-m // block) * block
            nbc = mp // block
            tmp = s.f32b[:mp]
            _decode_piece(
                bits[start // 8 : (end + 7) // 8], _scales_in(scales, b0, nbc, s), block, mp, tmp, s
            )
            out[start:end] = tmp[:m]


def int8_encode(x: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    if native.lib() is not None:
        native.int8_encode(x, out, block, bf16)
        return
    n = x.size
    scales, body = wire_split(out, n, block, bf16)
    q_all = body[:n].view(np.int8)
    chunk = _chunk_for(block)
    s = _scratch_for(chunk)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        m = end - start
        xc = x[start:end]
        xb = _padded(xc, s.f32b, block) if m % block else xc
        mp = xb.size
        nbc = mp // block
        b0 = start // block
        absx = s.f32a[:mp]
        np.abs(xb, out=absx)
        amax = s.f32c[:nbc]
        np.maximum.reduce(absx.reshape(nbc, block), axis=1, out=amax)
        sc = _scales_out(scales, b0, nbc, s)
        np.divide(amax, INT8_MAX, out=sc)
        # inv = 127 / amax (bf16: 1 / rounded scale), 0 for all-zero blocks (the C kernel's ops)
        inv = s.f32c[nbc : 2 * nbc]
        with np.errstate(divide="ignore"):
            if bf16:
                _bf16_round(sc)
                _scales_store(scales, b0, sc)
                np.divide(np.float32(1.0), sc, out=inv)
                inv[sc == 0] = 0.0
            else:
                np.divide(INT8_MAX, amax, out=inv)
                inv[amax == 0] = 0.0
        y = s.f32a[:mp]
        np.multiply(xb.reshape(nbc, block), inv[:, None], out=y.reshape(nbc, block))
        np.rint(y, out=y)
        np.clip(y, -INT8_MAX, INT8_MAX, out=y)
        q_all[start:end] = y[:m]  # float32 -> int8 cast in one pass


def int8_decode(payload: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    if native.lib() is not None:
        native.int8_decode(payload, out, block, bf16)
        return
    n = out.size
    scales, body = wire_split(payload, n, block, bf16)
    q_all = body[:n].view(np.int8)
    chunk = _chunk_for(block)
    s = _scratch_for(chunk)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        m = end - start
        b0 = start // block
        if m % block == 0:
            nbc = m // block
            dst = out[start:end]
            dst[:] = q_all[start:end]
            sc = _scales_in(scales, b0, nbc, s)
            np.multiply(dst.reshape(nbc, block), sc[:, None], out=dst.reshape(nbc, block))
        else:
            mp = -(-m // block) * block
            nbc = mp // block
            tmp = s.f32b[:mp]
            tmp[:m] = q_all[start:end]
            tmp[m:] = 0.0
            sc = _scales_in(scales, b0, nbc, s)
            np.multiply(tmp.reshape(nbc, block), sc[:, None], out=tmp.reshape(nbc, block))
            out[start:end] = tmp[:m]

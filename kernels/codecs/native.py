"""The single-pass C codecs (``csrc/codec_simd.c``), built at first use with the system compiler.

Why C: the numpy path needs five passes over each cache-sized piece (abs,
reduce, signbit, packbits, copy) and reaches ~0.4x memcpy; one fused pass
per block, with ``movemask`` packing 8 signs per instruction, runs at memory
speed. Built with ``cc -O3 -march=native`` into a cache directory keyed by the
source and the CPU (``$HETRUN_KERNEL_CACHE``, default ``~/.cache/hetrun``),
so each kind of node builds its own. No compiler, or ``HETRUN_NATIVE_CODECS=0``:
:func:`lib` returns None and the codecs use the numpy path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from hetrun.kernels.native_build import NativeLibrary

__all__ = [
    "fp8_decode",
    "fp8_e4m3_saturate",
    "fp8_encode",
    "int4_decode",
    "int4_encode",
    "int8_decode",
    "int8_encode",
    "lib",
    "onebit_decode",
    "onebit_encode",
    "onebit_stochastic_encode",
]

_SRC = Path(__file__).parents[1] / "csrc" / "codec_simd.c"  # kernels/csrc, shared by every C kernel


def _declare(dll: ctypes.CDLL) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    ci = ctypes.c_int
    dll.hr_onebit_encode.argtypes = [p, i64, i64, p, p, p, ci]
    dll.hr_onebit_decode.argtypes = [p, p, i64, i64, p, ci]
    dll.hr_int8_encode.argtypes = [p, i64, i64, p, p, ci]
    dll.hr_int8_decode.argtypes = [p, p, i64, i64, p, ci]
    dll.hr_int4_encode.argtypes = [p, i64, i64, p, p, ci]
    dll.hr_int4_decode.argtypes = [p, p, i64, i64, p, ci]
    u32 = ctypes.c_uint32
    dll.hr_onebit_stochastic_encode.argtypes = [p, i64, i64, p, p, u32, u32]
    dll.hr_fp8_encode.argtypes = [p, i64, i64, p, p]
    dll.hr_fp8_decode.argtypes = [p, p, i64, i64, p]
    dll.hr_fp8_e4m3_saturate.argtypes = [p, i64, p]
    for f in (dll.hr_onebit_encode, dll.hr_onebit_decode, dll.hr_int8_encode, dll.hr_int8_decode,
              dll.hr_onebit_stochastic_encode, dll.hr_fp8_encode, dll.hr_fp8_decode,
              dll.hr_fp8_e4m3_saturate, dll.hr_int4_encode, dll.hr_int4_decode):
        f.restype = None
    dll.hr_has_avx2.restype = ctypes.c_int


_native = NativeLibrary("codec_simd", _SRC, compile_flags=["-O3", "-march=native"],
                        disable_env="HETRUN_NATIVE_CODECS", declare=_declare)


def lib() -> ctypes.CDLL | None:
    """The loaded library, or None (no compiler, or disabled by HETRUN_NATIVE_CODECS=0)."""
    return _native.load()


def _ptr(a: np.ndarray) -> int:
    if not a.flags.c_contiguous:
        raise ValueError("native codecs need contiguous arrays")
    return a.ctypes.data


def _scale_end(n: int, block: int, bf16: bool) -> int:
    """Where the values start in a payload: after one fp32 (or bf16) scale per block."""
    return -(-n // block) * (2 if bf16 else 4)


def onebit_encode(
    x: np.ndarray, out: np.ndarray, block: int, residual: np.ndarray | None, bf16: bool = False
) -> None:
    n = x.size
    k = _scale_end(n, block, bf16)
    dll = lib()
    assert dll is not None
    dll.hr_onebit_encode(
        _ptr(x), n, block, _ptr(out[:k]), _ptr(out[k:]),
        None if residual is None else _ptr(residual), int(bf16),
    )


def onebit_decode(payload: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    n = out.size
    k = _scale_end(n, block, bf16)
    dll = lib()
    assert dll is not None
    dll.hr_onebit_decode(_ptr(payload[:k]), _ptr(payload[k:]), n, block, _ptr(out), int(bf16))


def int8_encode(x: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    n = x.size
    k = _scale_end(n, block, bf16)
    dll = lib()
    assert dll is not None
    dll.hr_int8_encode(_ptr(x), n, block, _ptr(out[:k]), _ptr(out[k:]), int(bf16))


def int8_decode(payload: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    n = out.size
    k = _scale_end(n, block, bf16)
    dll = lib()
    assert dll is not None
    dll.hr_int8_decode(_ptr(payload[:k]), _ptr(payload[k:]), n, block, _ptr(out), int(bf16))


def int4_encode(x: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    n = x.size
    k = _scale_end(n, block, bf16)
    dll = lib()
    assert dll is not None
    dll.hr_int4_encode(_ptr(x), n, block, _ptr(out[:k]), _ptr(out[k:]), int(bf16))


def int4_decode(payload: np.ndarray, out: np.ndarray, block: int, bf16: bool = False) -> None:
    n = out.size
    k = _scale_end(n, block, bf16)
    dll = lib()
    assert dll is not None
    dll.hr_int4_decode(_ptr(payload[:k]), _ptr(payload[k:]), n, block, _ptr(out), int(bf16))


def onebit_stochastic_encode(x: np.ndarray, out: np.ndarray, block: int, keys: tuple[int, int]) -> None:
    """``keys``: the two 32-bit words keying the counter-based draws (one pair per call)."""
    n = x.size
    nb = -(-n // block)
    dll = lib()
    assert dll is not None
    dll.hr_onebit_stochastic_encode(
        _ptr(x), n, block, _ptr(out[: 4 * nb]), _ptr(out[4 * nb :]), keys[0], keys[1]
    )


def fp8_encode(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n = x.size
    nb = -(-n // block)
    dll = lib()
    assert dll is not None
    dll.hr_fp8_encode(_ptr(x), n, block, _ptr(out[: 4 * nb]), _ptr(out[4 * nb :]))


def fp8_decode(payload: np.ndarray, out: np.ndarray, block: int) -> None:
    n = out.size
    nb = -(-n // block)
    dll = lib()
    assert dll is not None
    dll.hr_fp8_decode(_ptr(payload[: 4 * nb]), _ptr(payload[4 * nb :]), n, block, _ptr(out))


def fp8_e4m3_saturate(x: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the float8_e4m3fn bits of clamp(x[i], -448, 448) (the cast alone, for tests)."""
    dll = lib()
    assert dll is not None
    dll.hr_fp8_e4m3_saturate(_ptr(x), x.size, _ptr(out))

"""``csrc/fused_gelu.c`` built at first use: GELU forward, and backward fused with the bias-gradient sum.

Compiled with ``cc -O3 -march=native -ffast-math -fopenmp-simd`` (the inline
erf/exp polynomials vectorise) by ``kernels/native_build.py``, which links
without ``-ffast-math`` (no process-wide flush-to-zero), into
``$HETRUN_KERNEL_CACHE`` (default ``~/.cache/hetrun``), keyed by source, flags
and CPU. No compiler, a failed build, or ``HETRUN_NATIVE_FUSED=0``:
:func:`lib` returns None and callers use ATen.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from hetrun.kernels.native_build import NativeLibrary

from hetrun.errors import HetrunError

__all__ = ["gelu_backward_bias", "gelu_forward", "lib"]

_SRC = Path(__file__).with_name("csrc") / "fused_gelu.c"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0




def _declare(dll: ctypes.CDLL) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    dll.hr_gelu_backward_bias.argtypes = [p, p, p, p, i64, i64, i64]
    dll.hr_gelu_backward_bias.restype = None
    dll.hr_gelu_forward.argtypes = [p, p, i64, i64]
    dll.hr_gelu_forward.restype = None


# -ffast-math for code generation only: native_build links without it.
_native = NativeLibrary("fused_gelu", _SRC, compile_flags=["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"],
                        disable_env="HETRUN_NATIVE_FUSED", declare=_declare)


def lib() -> ctypes.CDLL | None:
    """The loaded library, or None (no compiler, or disabled by HETRUN_NATIVE_FUSED=0)."""
    return _native.load()


def _split(n: int, min_per_thread: int) -> list[int]:
    """Bounds of ``torch.get_num_threads()`` (or fewer) equal parts of ``range(n)``."""
    parts = max(1, min(torch.get_num_threads(), n // min_per_thread))
    return [n * i // parts for i in range(parts + 1)]


def _run_parts(part: Callable[[int], None], parts: int) -> None:
    """``part(0..parts-1)``, on Python threads when more than one: ctypes drops the GIL."""
    global _pool, _pool_size
    if parts == 1:
        part(0)
        return
    if _pool is None or _pool_size < parts:
        _pool = ThreadPoolExecutor(max_workers=parts, thread_name_prefix="hetrun-fused")
        _pool_size = parts
    list(_pool.map(part, range(parts)))


def _check(name: str, *ts: torch.Tensor) -> None:
    # The C side gets raw pointers: a wrong layout would read or write out of bounds.
    for t in ts:
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or t.shape != ts[0].shape:
            raise HetrunError(
                f"{name}: needs contiguous float32 CPU tensors of one shape, got "
                f"{[(tuple(u.shape), u.dtype, u.device.type, u.is_contiguous()) for u in ts]}",
                hint="call .contiguous().float() first, or use the ATen ops",
            )


def gelu_forward(h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Exact-erf GELU of ``h`` into ``out`` (fp32 contiguous CPU; ``out`` may be ``h``)."""
    _check("gelu_forward", h, out)
    dll = lib()
    assert dll is not None
    bounds = _split(h.numel(), 1 << 14)
    src, dst = h.data_ptr(), out.data_ptr()
    _run_parts(lambda i: dll.hr_gelu_forward(src, dst, bounds[i], bounds[i + 1]), len(bounds) - 1)
    return out


def gelu_backward_bias(gy: torch.Tensor, h: torch.Tensor, gh: torch.Tensor) -> torch.Tensor:
    """Write ``gelu'(h) * gy`` into ``gh`` and return its column sum (all [T, F] fp32 contiguous CPU).

    Rows are split over ``torch.get_num_threads()`` threads, each summing into
    its own float64 bias row.
    """
    _check("gelu_backward_bias", gy, h, gh)
    if gy.dim() != 2:
        raise HetrunError(f"gelu_backward_bias: needs [T, F] tensors, got shape {tuple(gy.shape)}")
    dll = lib()
    assert dll is not None
    rows, cols = gy.shape
    bounds = _split(rows, 64)
    partial = torch.zeros(len(bounds) - 1, cols, dtype=torch.float64)
    args = (gy.data_ptr(), h.data_ptr(), gh.data_ptr())

    def part(i: int) -> None:
        dll.hr_gelu_backward_bias(*args, partial[i].data_ptr(), bounds[i], bounds[i + 1], cols)

    _run_parts(part, len(bounds) - 1)
    return partial.sum(0).to(torch.float32)

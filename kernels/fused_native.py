"""``csrc/fused_gelu.c`` built at first use: GELU backward fused with the bias-gradient sum.

Built with ``cc -O3 -march=native -ffast-math -fopenmp-simd`` (the inline
erf/exp polynomials vectorise) into ``$HETRUN_KERNEL_CACHE`` (default ``~/.cache/hetrun``),
keyed by source and CPU like the codec library. No compiler, a failed build, or
``HETRUN_NATIVE_FUSED=0``: :func:`lib` returns None and callers use ATen.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from hetrun.kernels.codec_native import _cpu_tag

__all__ = ["gelu_backward_bias", "lib"]

_SRC = Path(__file__).with_name("csrc") / "fused_gelu.c"
_lib: ctypes.CDLL | None = None
_tried = False
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not _SRC.exists():
        return None
    key = hashlib.sha256(_SRC.read_bytes() + _cpu_tag().encode()).hexdigest()[:16]
    cache = Path(os.environ.get("HETRUN_KERNEL_CACHE", Path.home() / ".cache" / "hetrun"))
    so = cache / f"fused_gelu-{key}.so"
    if not so.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: processes building at once never load a half-written file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        cmd = [cc, "-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-shared", "-fPIC",
               "-o", tmp, str(_SRC), "-lm"]
        try:
            ok = subprocess.run(cmd, capture_output=True, text=True).returncode == 0
        except OSError:
            ok = False
        if not ok:
            os.unlink(tmp)
            return None
        os.replace(tmp, so)
    dll = ctypes.CDLL(str(so))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    dll.hr_gelu_backward_bias.argtypes = [p, p, p, p, i64, i64, i64]
    dll.hr_gelu_backward_bias.restype = None
    return dll


def lib() -> ctypes.CDLL | None:
    """The loaded library, or None (no compiler, or disabled by HETRUN_NATIVE_FUSED=0)."""
    global _lib, _tried
    if os.environ.get("HETRUN_NATIVE_FUSED", "1") == "0":
        return None
    if not _tried:
        _tried = True
        try:
            _lib = _build()
        except OSError:
            _lib = None
    return _lib


def gelu_backward_bias(gy: torch.Tensor, h: torch.Tensor, gh: torch.Tensor) -> torch.Tensor:
    """Write ``gelu'(h) * gy`` into ``gh`` and return its column sum (all [T, F] fp32 contiguous CPU).

    Splits rows over ``torch.get_num_threads()`` Python threads: ctypes drops
    the GIL, and each thread sums into its own bias row.
    """
    dll = lib()
    assert dll is not None
    rows, cols = gy.shape
    nthreads = max(1, min(torch.get_num_threads(), rows // 64))
    partial = torch.zeros(nthreads, cols, dtype=torch.float64)
    args = (gy.data_ptr(), h.data_ptr(), gh.data_ptr())
    bounds = [rows * i // nthreads for i in range(nthreads + 1)]

    def part(i: int) -> None:
        dll.hr_gelu_backward_bias(
            *args, partial[i].data_ptr(), bounds[i], bounds[i + 1], cols
        )

    if nthreads == 1:
        part(0)
        return partial[0].to(torch.float32)
    global _pool, _pool_size
    if _pool is None or _pool_size < nthreads:
        _pool = ThreadPoolExecutor(max_workers=nthreads, thread_name_prefix="hetrun-fused")
        _pool_size = nthreads
    list(_pool.map(part, range(nthreads)))
    return partial.sum(0).to(torch.float32)

"""Decompress one zstd frame straight into a caller's buffer.

python-zstandard can only decompress into a buffer of ours through its
streaming reader, which decodes into zstd's window buffer and copies out
from there, in read-size steps. libzstd's one-shot ``ZSTD_decompressDCtx``
writes the output in place, once. The system library (``libzstd.so.1``, which
Debian's package manager itself depends on) is called through ctypes, which
releases the GIL for the call, so restore threads decode in parallel. Where
the library cannot be loaded, :func:`available` is False and the caller keeps
the streaming path (same bytes, slower).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

import numpy as np

_lib: Any = None
_load_lock = threading.Lock()
_tried = False


def _load() -> Any:
    global _lib, _tried
    with _load_lock:
        if _tried:
            return _lib
        _tried = True
        for name in ("libzstd.so.1", ctypes.util.find_library("zstd")):
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                lib.ZSTD_createDCtx.restype = ctypes.c_void_p
                lib.ZSTD_createDCtx.argtypes = []
                lib.ZSTD_freeDCtx.restype = ctypes.c_size_t
                lib.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
                lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
                lib.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                    ctypes.c_void_p, ctypes.c_size_t]
                lib.ZSTD_isError.restype = ctypes.c_uint
                lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
                lib.ZSTD_getErrorName.restype = ctypes.c_char_p
                lib.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):
                continue
            _lib = lib
            break
        return _lib


def available() -> bool:
    return _load() is not None


class DirectDecompressor:
    """One thread's libzstd decompression context (contexts are not thread-safe)."""

    def __init__(self) -> None:
        lib = _load()
        if lib is None:
            raise RuntimeError("libzstd.so.1 is not loadable")
        self._lib = lib
        self._dctx = lib.ZSTD_createDCtx()
        if not self._dctx:
            raise MemoryError("ZSTD_createDCtx failed")

    def decompress_into(self, src: Any, dst: np.ndarray) -> int:
        """Decode the frame(s) in ``src`` (any buffer) into ``dst`` (contiguous
        uint8, written from its start); returns the decoded length. Raises
        ``ValueError`` with zstd's reason for a corrupt frame or one that does not
        fit ``dst``."""
        s = np.frombuffer(src, dtype=np.uint8)  # read-only views (mapped files) included
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("destination must be a writable contiguous buffer")
        n = self._lib.ZSTD_decompressDCtx(self._dctx, dst.ctypes.data, dst.nbytes,
                                          s.ctypes.data if s.size else None, s.size)
        if self._lib.ZSTD_isError(n):
            raise ValueError(self._lib.ZSTD_getErrorName(n).decode("ascii", "replace"))
        return int(n)

    def __del__(self) -> None:
        dctx, self._dctx = getattr(self, "_dctx", None), None
        if dctx:
            self._lib.ZSTD_freeDCtx(dctx)

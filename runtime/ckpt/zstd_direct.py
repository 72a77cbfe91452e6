"""libzstd called directly: decompress into a caller's buffer; compress with
settings python-zstandard cannot express.

Decompression:

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
                lib.ZSTD_createCCtx.restype = ctypes.c_void_p
                lib.ZSTD_createCCtx.argtypes = []
                lib.ZSTD_freeCCtx.restype = ctypes.c_size_t
                lib.ZSTD_freeCCtx.argtypes = [ctypes.c_void_p]
                lib.ZSTD_CCtx_setParameter.restype = ctypes.c_size_t
                lib.ZSTD_CCtx_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
                lib.ZSTD_compress2.restype = ctypes.c_size_t
                lib.ZSTD_compress2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.c_void_p, ctypes.c_size_t]
                lib.ZSTD_compressBound.restype = ctypes.c_size_t
                lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):
                continue
            _lib = lib
            break
        return _lib


def available() -> bool:
    return _load() is not None


class _Context:
    """A libzstd context owned by one thread (contexts are not thread-safe),
    freed with its Python object. ``kind``: "C" (compression) or "D"."""

    def __init__(self, kind: str) -> None:
        lib = _load()
        if lib is None:
            raise RuntimeError("libzstd.so.1 is not loadable")
        self._lib = lib
        self._free = getattr(lib, f"ZSTD_free{kind}Ctx")
        self._ctx = getattr(lib, f"ZSTD_create{kind}Ctx")()
        if not self._ctx:
            raise MemoryError(f"ZSTD_create{kind}Ctx failed")

    def __del__(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx:
            self._free(ctx)


class DirectDecompressor(_Context):
    """One thread's libzstd decompression context."""

    def __init__(self) -> None:
        super().__init__("D")

    def decompress_into(self, src: Any, dst: np.ndarray) -> int:
        """Decode the frame(s) in ``src`` (any buffer) into ``dst`` (contiguous
        uint8, written from its start); returns the decoded length. Raises
        ``ValueError`` with zstd's reason for a corrupt frame or one that does not
        fit ``dst``."""
        s = np.frombuffer(src, dtype=np.uint8)  # read-only views (mapped files) included
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("destination must be a writable contiguous buffer")
        n = self._lib.ZSTD_decompressDCtx(self._ctx, dst.ctypes.data, dst.nbytes,
                                          s.ctypes.data if s.size else None, s.size)
        if self._lib.ZSTD_isError(n):
            raise ValueError(self._lib.ZSTD_getErrorName(n).decode("ascii", "replace"))
        return int(n)


# Compression parameters by number (zstd.h; stable across 1.4-1.5, and the
# "experimental" literal-mode parameter is accepted by the shared library).
_C_WINDOW_LOG, _C_HASH_LOG, _C_CHAIN_LOG, _C_SEARCH_LOG = 101, 102, 103, 104
_C_MIN_MATCH, _C_TARGET_LENGTH, _C_STRATEGY, _C_CONTENT_SIZE = 105, 106, 107, 200
_C_LITERAL_MODE = 1002  # ZSTD_c_literalCompressionMode: 1 = always Huffman-code literals
_FAST = 1


class DirectCompressor(_Context):
    """One thread's libzstd compression context with the byte-plane settings.

    What python-zstandard cannot set: the fast strategy with a large
    acceleration (``targetLength``), which skips ahead quickly where no match
    is found, while literals stay Huffman-coded (``literalCompressionMode``;
    by default zstd stops coding literals once acceleration is on). Byte
    planes are nearly match-free, so the match search is most of zstd's time
    and the Huffman-coded literals most of its gain.
    """

    def __init__(self, *, acceleration: int = 1024, window_log: int = 17, hash_log: int = 8,
                 min_match: int = 7) -> None:
        super().__init__("C")
        lib = self._lib
        for key, value in ((_C_STRATEGY, _FAST), (_C_WINDOW_LOG, window_log), (_C_HASH_LOG, hash_log),
                           (_C_CHAIN_LOG, 6), (_C_SEARCH_LOG, 1), (_C_MIN_MATCH, min_match),
                           (_C_TARGET_LENGTH, acceleration), (_C_CONTENT_SIZE, 1), (_C_LITERAL_MODE, 1)):
            r = lib.ZSTD_CCtx_setParameter(self._ctx, key, value)
            if lib.ZSTD_isError(r):
                raise RuntimeError(f"zstd parameter {key}={value}: {lib.ZSTD_getErrorName(r).decode()}")
        self._dst = np.empty(0, dtype=np.uint8)

    def bound(self, n: int) -> int:
        """The most bytes ``n`` input bytes can compress to."""
        return int(self._lib.ZSTD_compressBound(n))

    def compress_into(self, src: Any, dst: np.ndarray) -> int:
        """Compress ``src`` into ``dst`` (contiguous uint8, at least
        :meth:`bound` bytes); returns the compressed length. Saves the copy
        into a new ``bytes`` that :meth:`compress` makes."""
        s = np.frombuffer(src, dtype=np.uint8)
        if not dst.flags.c_contiguous or not dst.flags.writeable or dst.size < self.bound(s.size):
            raise ValueError("destination must be a writable contiguous buffer of at least bound() bytes")
        n = self._lib.ZSTD_compress2(self._ctx, dst.ctypes.data, dst.size, s.ctypes.data if s.size else None, s.size)
        if self._lib.ZSTD_isError(n):
            raise RuntimeError(f"zstd compression failed: {self._lib.ZSTD_getErrorName(n).decode()}")
        return int(n)

    def compress(self, src: Any) -> bytes:
        n = np.frombuffer(src, dtype=np.uint8).size
        if self._dst.size < self.bound(n):
            self._dst = np.empty(self.bound(n), dtype=np.uint8)
        return self._dst[: self.compress_into(src, self._dst)].tobytes()

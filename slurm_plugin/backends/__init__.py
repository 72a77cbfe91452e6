"""Backends behind one interface (``base.Backend``): ``sbatch`` (Slurm command
line), ``pyslurm`` (Slurm C API, when the build matches the cluster) and
``local`` (no Slurm). ``auto`` is sbatch when ``sbatch`` is on PATH, else local.
"""

from __future__ import annotations

import shutil

from hetrun.dag.errors import SlurmError, closest

from .base import Backend, ComponentStatus, DryRun, RunStatus

BACKENDS = ("auto", "sbatch", "local", "pyslurm")


def resolve_name(name: str) -> str:
    """The concrete backend ``name`` stands for (``auto`` -> sbatch or local)."""
    if name not in BACKENDS:
        near = closest(name, BACKENDS)
        raise SlurmError(f"unknown backend {name!r}",
                         hint=(f"did you mean {near!r}? " if near else "") + "choose one of " + ", ".join(BACKENDS))
    if name == "auto":
        return "sbatch" if shutil.which("sbatch") else "local"
    return name


def get_backend(name: str = "auto") -> Backend:
    concrete = resolve_name(name)
    if concrete == "sbatch":
        from .sbatch import SbatchBackend

        return SbatchBackend()
    if concrete == "pyslurm":
        from .pyslurm_backend import PyslurmBackend

        return PyslurmBackend()
    from .local import LocalBackend

    return LocalBackend()


__all__ = ["BACKENDS", "Backend", "ComponentStatus", "DryRun", "RunStatus", "get_backend", "resolve_name"]

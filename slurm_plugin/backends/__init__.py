"""Backends behind one interface (``base.Backend``): ``sbatch`` (Slurm command
line), ``pyslurm`` (Slurm C API, when the build matches the cluster) and
``local`` (no Slurm). ``auto`` is sbatch when a Slurm controller answers
``scontrol ping`` within a couple of seconds, else local; ``choose_auto`` says why.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass

from hetrun.errors import SlurmError, closest

from .base import Backend, ComponentStatus, DryRun, RunStatus

BACKENDS = ("auto", "sbatch", "local", "pyslurm")
# How long `auto` waits for the controller. An up slurmctld answers in
# milliseconds; the sbatch backend's own retries (about a minute) are for
# controllers that are busy, not for deciding whether there is one.
AUTO_PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str


def choose_auto(timeout_s: float = AUTO_PROBE_TIMEOUT_S) -> BackendChoice:
    """The backend ``auto`` stands for here and now, and why."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        return BackendChoice("local", "no sbatch on PATH (Slurm is not installed here)")
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return BackendChoice("local", f"{sbatch} exists but scontrol does not, so no controller can be asked")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([scontrol, "ping"], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return BackendChoice("local", f"sbatch is installed but no Slurm controller answered "
                                      f"`scontrol ping` within {timeout_s:g} s")
    except OSError as exc:
        return BackendChoice("local", f"`scontrol ping` could not run: {exc.strerror or exc}")
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    up = next((ln for ln in lines if ln.endswith(" is UP")), None)
    if proc.returncode == 0 and up is not None:
        return BackendChoice("sbatch", f"{up} (scontrol ping, {time.monotonic() - t0:.2f} s)")
    said = lines[0] if lines else f"exit code {proc.returncode}"
    return BackendChoice("local", f"sbatch is installed but `scontrol ping` says: {said[:200]}")


def resolve_name(name: str) -> str:
    """The concrete backend ``name`` stands for (``auto`` -> sbatch or local)."""
    if name not in BACKENDS:
        near = closest(name, BACKENDS)
        raise SlurmError(f"unknown backend {name!r}",
                         hint=(f"did you mean {near!r}? " if near else "") + "choose one of " + ", ".join(BACKENDS))
    if name == "auto":
        return choose_auto().name
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


__all__ = ["BACKENDS", "Backend", "BackendChoice", "ComponentStatus", "DryRun", "RunStatus", "choose_auto",
           "get_backend", "resolve_name"]

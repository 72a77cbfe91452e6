"""Environment and command line for real Open MPI ranks on this one node, over loopback.

Tests and benchmarks start ``mpirun`` themselves (not through a backend); this
is the one place that says how. Open MPI refuses to run as root without the
two ``ALLOW_RUN_AS_ROOT`` variables, and without pinning its byte and
out-of-band transports to ``lo`` it probes every interface (slow, and it fails
in network namespaces). One OpenMP thread per rank because ranks are
oversubscribed on few cores.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

LOOPBACK_MPI_ENV: Mapping[str, str] = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMP_NUM_THREADS": "1",
}


def loopback_mpi_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) with the loopback settings, then ``extra``, on top."""
    return {**(os.environ if base is None else base), **LOOPBACK_MPI_ENV, **extra}


def mpirun_argv(np: int, argv: Sequence[str], *, oversubscribe: bool = True) -> list[str]:
    """``mpirun [--oversubscribe] -np <np> <argv...>``: ``argv`` is the program and its arguments."""
    return ["mpirun", *(["--oversubscribe"] if oversubscribe else []), "-np", str(np), *argv]

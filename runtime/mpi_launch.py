"""Real Open MPI ranks on this one node, over loopback: environment, command line, gloo group.

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
from typing import Any

from . import mpi_wait

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


def init_loopback_gloo(comm: Any, timeout_s: float | None = None) -> None:
    """torch.distributed over gloo on 127.0.0.1 for the ranks of the mpi4py communicator ``comm``.

    Rank 0 opens the TCP store on a port the OS picks and MPI tells the others:
    no fixed port to collide on, and no gap between choosing a port and binding it.
    ``timeout_s`` None keeps torch's defaults.
    """
    from datetime import timedelta

    import torch.distributed as dist

    rank, size = comm.Get_rank(), comm.Get_size()
    kw: dict[str, Any] = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    store = None
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False, **kw)
    port = mpi_wait.bcast(comm, None if store is None else int(store.port), root=0)
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False, **kw)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, **kw)

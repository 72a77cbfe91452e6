"""The one collective the checkpoint store needs: all-gather of small JSON-able values.

Commit ("every rank's shard is complete, now write the manifest") and restore
("which checkpoint can every rank load") are agreements between ranks. The
store stays independent of how ranks talk: a single process uses
``SoloCollective``; an MPI job passes ``MPICollective(comm)``, which
duplicates the communicator so the background writer's messages never mix
with the training's.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Protocol

from hetrun.runtime import mpi_wait


class Collective(Protocol):
    rank: int
    size: int

    def allgather(self, value: Any) -> list[Any]: ...


class SoloCollective:
    rank = 0
    size = 1

    def allgather(self, value: Any) -> list[Any]:
        return [value]


class MPICollective:
    """All-gather over a private duplicate of an mpi4py communicator.

    The checkpoint writer calls this from its background thread, so MPI must
    run with MPI_THREAD_MULTIPLE (mpi4py asks for it by default)."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            from hetrun.errors import CheckpointError

            raise CheckpointError(
                "asynchronous checkpoints need MPI_THREAD_MULTIPLE, the MPI library provides less",
                hint="keep mpi4py's default (mpi4py.rc.thread_level = 'multiple') or use an "
                "MPI built with thread support",
            )
        self._comm = mpi_wait.dup(comm)
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()

    def allgather(self, value: Any) -> list[Any]:
        return mpi_wait.allgather(self._comm, value)

    def free(self) -> None:
        self._comm.Free()


def node_leaders(coll: Collective, local_dir: str | None = None) -> tuple[bool, str]:
    """(whether this rank is the lowest rank sharing its node-local directory,
    the node name). That rank writes the local tier's manifest. The node is
    Slurm's node name when set (emulated nodes share one host name)."""
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    key = f"{host}:{local_dir or ''}"
    keys = coll.allgather(key)
    return keys.index(key) == coll.rank, host

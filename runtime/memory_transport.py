"""How the memory tier's ranks talk: one small interface, implemented over MPI (the executor's
ranks) and over torch.distributed gloo (a command component's ranks, through the run API).

``MemorySnapshots`` (runtime/memory_tier.py) holds every rule: the blob, the partners, adaptive
N, the agreement on the freshest common step, verification and fallback. A transport only moves
bytes and small values:

- ``allgather(value)``: small values (node names, what a node holds, copies that failed), every
  rank's in rank order. Lists and dicts with string keys only (the gloo one sends JSON).
- ``start_max(value)``: a non-blocking MAX all-reduce of one int (the adaptive N's agreement);
  its handle's ``wait()`` returns the maximum.
- ``bind(sources, dests, tier)``, ``send(step, slot)``, ``drain()``, ``close()``: replicas, moved
  by the rank's replica keeper (runtime/replica_keeper.py), a process of its own: ``bind`` is
  collective and starts it; ``send`` tells it the rank's blob of ``step`` is in its ``slot`` of
  ``tier`` and never waits for a partner; the keeper copies every replica that arrives into
  this node's slots of ``tier`` (a restore verifies it); ``drain`` is collective: every replica
  sent has been copied before any rank returns.
- ``exchange(sends, source)``: a restore's transfers, blocking: ``sends`` {owner rank: blob} go
  out, the one blob from ``source`` (None: none) comes back.
- ``barrier()``.
- ``thread_cpu_s``: CPU seconds of the replica keeper, which the adaptive N counts as the
  tier's cost (on the node's cores).
- ``skipped``: replicas not sent because a newer one of the same rank was ready before they
  left (behind a slow partner, or a keeper behind its rank's slots).

Replicas travel on plain TCP streams between each rank's keeper and its partners', with a
sending and a receiving thread (runtime/replica_sockets.py), whichever library the small
collectives use. Gloo
can neither test a receive without blocking nor receive from "any source", and gloo sends on a
thread cost the DDP example 2.9 ms a step where the tier's code took 1.0 ms. MPI can, and the MPI
transport once received on the training thread whenever the tier was polled (an improbe and a
few Tests between actions, the receive, the replica's write): for the PPO learner, on the
critical path, that was 0.3-0.4 ms of an iteration of ~45 ms, a tenth of the 2 % budget, spent
in front of training rather than beside it (benchmarks/node_death.md, session 28). The streams
then ran on two threads of the rank's process, and their wake-ups and GIL hand-backs still cost
the PPO example's whole iteration 6-7 % (session 43); in the keeper the rank sends a 17-byte
frame per snapshot and nothing else of replication runs in its process. The small collectives and the
restore's transfers stay on the communicator (MPI) or two gloo groups of the tier's own, so they
never interleave with the script's collectives or with each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from hetrun.runtime import mpi_wait

DRAIN_TIMEOUT_S = 300.0  # close(): a partner that never drains its replica stream is reported, not waited on forever


def wrap(comm: Any) -> Any:
    """A transport for ``comm``: an mpi4py communicator becomes an ``MPITransport``; anything
    else is taken to be a transport already (a ``GlooTransport``)."""
    return MPITransport(comm) if hasattr(comm, "Dup") else comm


class _Streams(ABC):
    """The replica half of a transport: the keeper ``bind`` starts (runtime/replica_keeper.py)."""

    _streams: Any = None  # runtime.replica_keeper.Keeper, from bind() (None: no partner anywhere)
    rank: int

    @property
    def error(self) -> BaseException | None:
        """Why replication stopped (a partner gone); None while it runs."""
        return None if self._streams is None else self._streams.error

    @property
    def thread_cpu_s(self) -> float:
        """CPU seconds of the replica keeper (sending, receiving, copying replicas into this
        node's slots): off the rank's process, but on the node's cores, so the adaptive N counts it."""
        return 0.0 if self._streams is None else self._streams.cpu_s

    @property
    def replica_failures(self) -> tuple[int, str]:
        """Received replicas the keeper could not copy here (the tmpfs full), and why."""
        if self._streams is None:
            return 0, ""
        return self._streams.failed, self._streams.copy_error

    @property
    def skipped(self) -> int:
        """Replicas never sent: a newer one of the same rank was ready first, or the rank wrote
        over the slot before its keeper read it (a keeper behind)."""
        return 0 if self._streams is None else self._streams.skipped

    @abstractmethod
    def allgather(self, value: Any) -> list[Any]: ...

    @abstractmethod
    def barrier(self) -> None: ...

    def bind(self, sources: list[int], dests: list[int], tier: Any, anyone: bool = True) -> None:
        """Starts the rank's keeper (not waiting for it; ``ready`` meets it). ``anyone``: some
        rank has a partner (the same on every rank); without, no keeper starts anywhere."""
        if not anyone:
            return
        from hetrun.runtime.replica_keeper import Keeper

        self._streams = Keeper(self.rank, sources, dests, tier.dir, tier.keep)

    def ready(self) -> None:
        """Collective, once: the keepers' streams set up (at the first snapshot or the drain)."""
        if self._streams is not None:
            self._streams.ready(self.allgather)

    def send(self, step: int, slot: int) -> None:
        """The rank's blob of ``step``, in its ``slot``, to the partners ``bind`` connected."""
        self._streams.send(step, slot)

    def drain(self) -> None:
        if self._streams is not None:
            self.ready()
            self._streams.drain(DRAIN_TIMEOUT_S)
        if self.error is None:
            self.barrier()

    def close(self) -> None:
        """The keeper ends (after ``drain``: nothing in flight); its last counters stay readable."""
        if self._streams is not None:
            self._streams.close()


class MPITransport(_Streams):
    """The memory tier over a private duplicate of an mpi4py communicator (replicas: the streams)."""

    TAG_RESTORE = 0x4D55  # a verified copy on its way to its owner at restore

    def __init__(self, comm: Any) -> None:
        self.comm = mpi_wait.dup(comm)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def allgather(self, value: Any) -> list[Any]:
        return mpi_wait.allgather(self.comm, value)

    def start_max(self, value: int) -> Any:
        import numpy as np
        from mpi4py import MPI

        mine, got = np.array([value], dtype=np.int64), np.zeros(1, dtype=np.int64)
        return _MPIMax(self.comm.Iallreduce(mine, got, op=MPI.MAX), mine, got)

    def barrier(self) -> None:
        mpi_wait.meet(self.comm)

    def exchange(self, sends: dict[int, Any], source: int | None) -> Any:
        from mpi4py import MPI

        reqs = [self.comm.Isend([blob, MPI.BYTE], dest=o, tag=self.TAG_RESTORE) for o, blob in sends.items()]
        blob: Any = None
        if source is not None:
            status = MPI.Status()
            mpi_wait.probe(self.comm, source, self.TAG_RESTORE, status)
            blob = bytearray(status.Get_count(MPI.BYTE))
            self.comm.Recv([blob, MPI.BYTE], source=source, tag=self.TAG_RESTORE)
        for r in reqs:
            mpi_wait.wait_politely(r)
        return blob


class _MPIMax:
    __slots__ = ("got", "mine", "req")

    def __init__(self, req: Any, mine: Any, got: Any) -> None:
        self.req, self.mine, self.got = req, mine, got  # buffers live until complete

    def wait(self) -> int:
        mpi_wait.wait_politely(self.req)
        return int(self.got[0])


class GlooTransport(_Streams):
    """The memory tier over torch.distributed (gloo), for ranks that have a default process
    group and no MPI. Collective to create (two ``new_group`` calls, the same on every rank);
    ``bind`` is collective too (it opens the replica streams, runtime/replica_sockets.py)."""

    def __init__(self) -> None:
        import torch.distributed as dist
        from hetrun.runtime.api.collectives import TorchCollective, new_cpu_group

        self._dist = dist
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self._main = new_cpu_group()  # allgather, barrier, restore transfers (main thread)
        self._agree = new_cpu_group()  # the adaptive N's all-reduce, in flight across steps
        self._coll = TorchCollective(self._main)

    def allgather(self, value: Any) -> list[Any]:
        return self._coll.allgather(value)

    def start_max(self, value: int) -> Any:
        import torch

        buf = torch.tensor([value], dtype=torch.int64)
        work = self._dist.all_reduce(buf, op=self._dist.ReduceOp.MAX, group=self._agree, async_op=True)
        return _GlooMax(work, buf)

    def barrier(self) -> None:
        self._dist.barrier(group=self._main)

    def exchange(self, sends: dict[int, Any], source: int | None) -> Any:
        import torch

        dist, group = self._dist, self._main
        keep = []
        for o, blob in sends.items():
            size = torch.tensor([len(blob)], dtype=torch.int64)
            payload = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
            keep += [dist.isend(size, o, group=group), dist.isend(payload, o, group=group)]
        blob_in: Any = None
        if source is not None:
            n = torch.zeros(1, dtype=torch.int64)
            dist.recv(n, source, group=group)
            buf = torch.empty(int(n[0]), dtype=torch.uint8)
            dist.recv(buf, source, group=group)
            blob_in = memoryview(buf.numpy())
        for w in keep:
            w.wait()
        return blob_in


class _GlooMax:
    __slots__ = ("buf", "work")

    def __init__(self, work: Any, buf: Any) -> None:
        self.work, self.buf = work, buf

    def wait(self) -> int:
        self.work.wait()
        return int(self.buf[0])

"""How the memory tier's ranks talk: one small interface, implemented over MPI (the executor's
ranks) and over torch.distributed gloo (a command component's ranks, through the run API).

``MemorySnapshots`` (runtime/memory_tier.py) holds every rule: the blob, the partners, adaptive
N, the agreement on the freshest common step, verification and fallback. A transport only moves
bytes and small values:

- ``allgather(value)``: small values (node names, what a node holds, copies that failed), every
  rank's in rank order. Lists and dicts with string keys only (the gloo one sends JSON).
- ``start_max(value)``: a non-blocking MAX all-reduce of one int (the adaptive N's agreement);
  its handle's ``wait()`` returns the maximum.
- ``bind(sources, dests, deliver)``, ``send(dests, blob)``, ``poll()``, ``drain()``: replicas.
  ``bind`` is collective; ``send`` never waits for a partner; every replica that arrives is
  handed to ``deliver`` (which files it; a restore verifies it); ``drain`` is collective: every replica
  sent has been delivered before any rank returns.
- ``exchange(sends, source)``: a restore's transfers, blocking: ``sends`` {owner rank: blob} go
  out, the one blob from ``source`` (None: none) comes back.
- ``barrier()``.
- ``thread_cpu_s``: CPU seconds of the transport's own threads (gloo's replica streams; 0 for
  MPI), which the adaptive N counts as the tier's cost.
- ``skipped``: replicas not sent because a newer one of the same rank was ready before they
  left (gloo, behind a slow partner; 0 for MPI).

Why two implementations and not the MPI code over a fake communicator: the two libraries differ
where it matters. MPI can probe for a message from anyone and test a receive without blocking,
so the MPI transport receives on the training thread whenever the tier is polled. Gloo can do
neither (a gloo receive completes only inside ``wait``; a receive from "any source" is not
polled either), so the gloo transport moves replicas on plain TCP streams between each rank and
its partners, with a sending and a receiving thread (runtime/replica_sockets.py: measured, gloo
sends on a thread cost the DDP example 2.9 ms a step where the tier's code took 1.0 ms). The
small collectives use two gloo groups of the tier's own, so they never interleave with the
script's collectives or with each other; both are made at construction, collectively, on the
main thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hetrun.runtime import mpi_wait

Deliver = Callable[[Any], None]
DRAIN_TIMEOUT_S = 300.0  # close(): a partner that never drains its replica stream is reported, not waited on forever


def wrap(comm: Any) -> Any:
    """A transport for ``comm``: an mpi4py communicator becomes an ``MPITransport``; anything
    else is taken to be a transport already (a ``GlooTransport``)."""
    return MPITransport(comm) if hasattr(comm, "Dup") else comm


class MPITransport:
    """The memory tier over a private duplicate of an mpi4py communicator."""

    thread_cpu_s = 0.0  # no thread of its own: receives run on the training thread (``poll``)
    skipped = 0  # every replica is sent (non-blocking sends, completed in ``poll``)

    TAG_REPLICA = 0x4D54  # "MT": a replica blob
    TAG_RESTORE = 0x4D55  # a verified copy on its way to its owner at restore

    def __init__(self, comm: Any) -> None:
        self.comm = mpi_wait.dup(comm)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._deliver: Deliver = lambda _blob: None
        self._sends: list[tuple[Any, Any]] = []  # (request, blob kept alive until sent)
        self._recvs: list[tuple[Any, bytearray]] = []  # replicas being received

    def allgather(self, value: Any) -> list[Any]:
        return mpi_wait.allgather(self.comm, value)

    def start_max(self, value: int) -> Any:
        import numpy as np
        from mpi4py import MPI

        mine, got = np.array([value], dtype=np.int64), np.zeros(1, dtype=np.int64)
        return _MPIMax(self.comm.Iallreduce(mine, got, op=MPI.MAX), mine, got)

    def bind(self, sources: list[int], dests: list[int], deliver: Deliver) -> None:
        self._deliver = deliver  # MPI receives from anyone: the sources are not needed

    def send(self, dests: list[int], blob: Any) -> None:
        from mpi4py import MPI

        for p in dests:
            self._sends.append((self.comm.Isend([blob, MPI.BYTE], dest=p, tag=self.TAG_REPLICA), blob))

    def poll(self) -> None:
        """Start receiving the replicas that are announced, deliver those that have arrived,
        forget the sends that completed. Never blocks: a blocking receive would wait for the
        sender to enter MPI again (measured: 83 ms per snapshot on a busy rollout rank)."""
        from mpi4py import MPI

        status = MPI.Status()
        while (msg := self.comm.improbe(source=MPI.ANY_SOURCE, tag=self.TAG_REPLICA, status=status)) is not None:
            buf = bytearray(status.Get_count(MPI.BYTE))
            self._recvs.append((msg.Irecv([buf, MPI.BYTE]), buf))
        pending = []
        for req, buf in self._recvs:
            if req.Test():
                self._deliver(buf)
            else:
                pending.append((req, buf))
        self._recvs = pending
        self._sends = [(r, b) for r, b in self._sends if not r.Test()]

    def drain(self) -> None:
        """Collective: every send delivered (a non-blocking barrier once this rank's sends are
        done, polled with the receives: no rank leaves while a peer still sends to it)."""
        barrier = None
        while True:
            self.poll()
            if barrier is None and not self._sends:
                barrier = self.comm.Ibarrier()
            if barrier is not None and barrier.Test() and not self._recvs:
                break
            time.sleep(0.002)
        self.poll()

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


class GlooTransport:
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
        self._streams: Any = None  # runtime.replica_sockets.ReplicaSockets, from bind()

    @property
    def error(self) -> BaseException | None:
        """Why replication stopped (a partner gone); None while it runs."""
        return None if self._streams is None else self._streams.error

    @property
    def thread_cpu_s(self) -> float:
        """CPU seconds of the replica streams' threads (sending, receiving, writing):
        off the training thread, but on the same cores and under the same GIL, so the adaptive
        N counts it."""
        return 0.0 if self._streams is None else self._streams.thread_cpu_s

    @property
    def skipped(self) -> int:
        """Replicas never sent because a newer one of the same rank was ready first."""
        return 0 if self._streams is None else self._streams.skipped

    def allgather(self, value: Any) -> list[Any]:
        return self._coll.allgather(value)

    def start_max(self, value: int) -> Any:
        import torch

        buf = torch.tensor([value], dtype=torch.int64)
        work = self._dist.all_reduce(buf, op=self._dist.ReduceOp.MAX, group=self._agree, async_op=True)
        return _GlooMax(work, buf)

    def bind(self, sources: list[int], dests: list[int], deliver: Deliver) -> None:
        from hetrun.runtime.replica_sockets import ReplicaSockets

        self._streams = ReplicaSockets(self.rank, self.allgather, sources, dests, deliver)

    def send(self, dests: list[int], blob: Any) -> None:
        """To the partners ``bind`` connected (``dests`` are the same ranks)."""
        self._streams.send(blob)

    def poll(self) -> None:
        """Nothing to do: the receiving thread delivers as blobs arrive."""

    def drain(self) -> None:
        if self._streams is not None:
            self._streams.drain(DRAIN_TIMEOUT_S)
        if self.error is None:
            self.barrier()

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

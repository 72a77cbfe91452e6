"""Waiting for MPI peers without holding a core.

Open MPI's blocking calls busy-poll: a rank waiting in ``MPI_Barrier`` or a
blocking ``allgather`` for a peer that is still importing torch burns a whole
core meanwhile (measured: 3.07 CPU-s in a 3 s barrier wait). Ranks often share
cores (5 ranks on 2 cores on the local cluster, rollout workers next to
learners on a real node), and a requeued MoE job's evaluator spent ~3 CPU-s
spinning in start-up collectives while the four learners it waited for were
short of CPU (benchmarks/requeue.md).

So the runtime's collectives outside the training hot path first meet in a
non-blocking barrier completed by testing between short sleeps, then run the
blocking collective, which no longer waits for anyone. One barrier more per
collective costs well under a millisecond; start-up has a handful of them.
"""

from __future__ import annotations

from typing import Any

from hetrun.backoff import Backoff, poll_until

# Tests before the first sleep: a peer that is already there answers within them.
SPIN_TESTS = 200


def wait_politely(request: Any, *, max_sleep: float = 0.001, spin_tests: int = SPIN_TESTS) -> None:
    """Complete an MPI ``request``: a few tests, then tests between sleeps
    doubling up to ``max_sleep`` (the most a completed wait can overshoot).
    Each test drives Open MPI's progress engine, so bytes keep moving."""
    _until(request.Test, max_sleep, spin_tests)


def _until(test: Any, max_sleep: float, spin_tests: int = SPIN_TESTS) -> None:
    for _ in range(spin_tests):
        if test():
            return
    poll_until(test, Backoff(first=min(10e-6, max_sleep), most=max_sleep))


def meet(comm: Any) -> None:
    """Every rank of ``comm`` reached this point (a barrier that sleeps while waiting)."""
    if comm.Get_size() > 1:
        wait_politely(comm.Ibarrier())


def allgather(comm: Any, value: Any) -> list[Any]:
    """``comm.allgather(value)`` (pickled objects) without busy-waiting for late ranks."""
    meet(comm)
    return list(comm.allgather(value))


def dup(comm: Any) -> Any:
    """``comm.Dup()`` without busy-waiting: creating a communicator is a collective, and a
    rank that gets there first spins in it (measured in a restarted MoE LM: the evaluator
    spun in its agreement's ``Dup`` while the four learners loaded their state)."""
    meet(comm)
    return comm.Dup()


def split(comm: Any, color: int, key: int) -> Any:
    """``comm.Split(color, key)`` without busy-waiting (as ``dup``)."""
    meet(comm)
    return comm.Split(color=color, key=key)


def probe(comm: Any, source: int, tag: int, status: Any, *, max_sleep: float = 0.001) -> None:
    """``comm.Probe(source, tag, status)`` without busy-waiting for a late sender."""
    _until(lambda: comm.Iprobe(source=source, tag=tag, status=status), max_sleep)


def bcast(comm: Any, value: Any, root: int = 0) -> Any:
    """``comm.bcast(value, root)`` without busy-waiting for a late root."""
    meet(comm)
    return comm.bcast(value, root=root)

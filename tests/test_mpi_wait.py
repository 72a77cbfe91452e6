"""The runtime's start-up collectives wait for late ranks without burning a core.

Real Open MPI ranks: rank 1 arrives late at each collective (gather, broadcast,
a communicator's Dup and Split, a probe for its message, a barrier). With a
blocking MPI_Allgather rank 0 would spend ~1.5 CPU-s per collective polling
(Open MPI busy-waits); through hetrun.runtime.mpi_wait it must sleep instead,
and every collective must still return the right values.
"""

from __future__ import annotations

import json

from mpi_helpers import json_records, needs_mpirun, run_ranks

LATE_S = 1.0


@needs_mpirun
def test_late_rank_does_not_cost_the_waiting_rank_a_core() -> None:
    proc = run_ranks(2, __file__, timeout=120)
    lines = [r for r in json_records(proc.stdout) if isinstance(r, dict) and "rank" in r]
    by_rank = {r["rank"]: r for r in lines}
    assert set(by_rank) == {0, 1}, proc.stdout
    waiter = by_rank[0]
    assert waiter["gathered"] == [[0, "a"], [1, "b"]]
    assert waiter["bcast"] == {"from": 1}
    assert waiter["dup_size"] == 2 and waiter["split_size"] == 1  # Split by rank: a group each
    assert waiter["probed"] == [7, 1]  # the late sender's message, probed then received
    assert waiter["wall_s"] >= 6 * LATE_S * 0.9  # it really waited (six late arrivals)
    # Blocking collectives would use about wall_s of CPU here; sleeping waits a few percent.
    assert waiter["cpu_s"] < 0.25 * waiter["wall_s"], waiter


def _rank_main() -> None:
    import time

    from hetrun.runtime import mpi_wait
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    mpi_wait.meet(comm)  # both started: measure from here
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if rank == 1:
        time.sleep(LATE_S)
    gathered = mpi_wait.allgather(comm, [rank, "ab"[rank]])
    if rank == 1:
        time.sleep(LATE_S)
    got = mpi_wait.bcast(comm, {"from": 1} if rank == 1 else None, root=1)
    if rank == 1:
        time.sleep(LATE_S)
    dup = mpi_wait.dup(comm)
    if rank == 1:
        time.sleep(LATE_S)
    split = mpi_wait.split(comm, rank, rank)
    probed = None
    if rank == 1:
        time.sleep(LATE_S)
        comm.send([7, 1], dest=0, tag=5)
    else:
        mpi_wait.probe(comm, 1, 5, MPI.Status())
        probed = comm.recv(source=1, tag=5)
    if rank == 1:
        time.sleep(LATE_S)
    mpi_wait.meet(comm)
    out = {"rank": rank, "gathered": gathered, "bcast": got, "dup_size": dup.Get_size(),
           "split_size": split.Get_size(), "probed": probed,
           "wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _rank_main()

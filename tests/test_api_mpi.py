"""The run API under ``mpirun`` with no torch.distributed at all: the ranks
connect over MPI (the store's MPICollective, an Iallreduce stop agreement).
Each step draws from the global torch RNG, so an exact final state also
proves the per-rank RNG restore. SIGUSR1 to rank 1 only stops both ranks at
one step (exit 85); the rerun resumes and ends bit-identical.

Run as a script, this file is the rank body: ``python test_api_mpi.py OUT STEPS STEP_TIME``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

if __name__ != "__main__":
    from hetrun.runtime.mpi_launch import loopback_mpi_env, mpirun_argv

    from tests.api_helpers import EXIT_REQUEUE, events, run_once
    from tests.mpi_helpers import needs_mpirun

    pytestmark = [pytest.mark.mpi, needs_mpirun]

STEPS = 30


def rank_main(out: Path, steps: int, step_time: float) -> None:
    import torch

    import hetrun

    run = hetrun.attach()
    torch.manual_seed(run.rank)
    w = torch.zeros(64)
    start = run.restore({"w": w})
    for step in range(start, steps):
        w.mul_(0.9).add_(torch.randn(64))  # the RNG stream decides the result
        time.sleep(step_time)
        run.log(step, norm=float(w.norm()))
        if run.should_stop(step):
            run.save(step, {"w": w}, wait=True)
            run.exit_for_requeue()
        if step % 7 == 6:
            run.save(step, {"w": w})
    out.mkdir(parents=True, exist_ok=True)
    (out / f"w{run.rank}.bin").write_bytes(w.numpy().tobytes())
    run.close()


def _cmd(out: Path, step_time: float) -> list[str]:
    return mpirun_argv(2, [sys.executable, __file__, str(out), str(STEPS), str(step_time)])


def test_mpi_ranks_without_a_process_group_stop_together_and_resume_exactly(shared_tmp: Path) -> None:
    env = loopback_mpi_env()
    full = run_once(_cmd(shared_tmp / "full", 0.0), shared_tmp / "run_full", env=env)
    assert full.returncode == 0, full.stdout
    run_dir = shared_tmp / "run"
    stop_after = random.Random().randrange(2, STEPS - 12)
    first = run_once(_cmd(shared_tmp / "out", 0.1), run_dir, stop_rank=1, stop_after=stop_after, env=env)
    assert first.returncode != 0, first.stdout
    exits = {e["rank"]: (e["code"], e["reason"]) for e in events(run_dir) if e["ev"] == "exit"}
    assert exits == {0: (EXIT_REQUEUE, "stop agreed with other ranks"), 1: (EXIT_REQUEUE, "signal SIGUSR1")}
    starts = {e["launcher"] for e in events(run_dir) if e["ev"] == "start"}
    assert starts == {"mpirun"}
    second = run_once(_cmd(shared_tmp / "out", 0.0), run_dir, env=env)
    assert second.returncode == 0, second.stdout
    for r in (0, 1):
        assert (shared_tmp / "out" / f"w{r}.bin").read_bytes() == (shared_tmp / "full" / f"w{r}.bin").read_bytes()


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))

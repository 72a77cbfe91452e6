"""One rank's life: plan -> world -> start event -> executor -> exit/error event.

A rank that raises writes ``{"ev": "error", ...}`` with its traceback and a
``rank_failure`` line (``detected_by: "runtime"``), prints the message on
stderr and calls ``MPI_Abort``, which ends every rank of the job at once: no
peer is left waiting on a dead rank. A rank that dies without raising (kill,
segfault, exit during start-up) is named by the launcher's post-mortem
(``hetrun.slurm_plugin.postmortem``).

Before exiting with a non-zero code after an agreed stop (85, 143) every rank
meets its peers once its checkpoint is flushed: srun runs with
``--kill-on-bad-exit=1`` and mpirun ends the job on a non-zero exit, so the
first rank out must not take a peer's unfinished save with it.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hetrun.errors import HetrunError, RunDirError

from . import mpi_wait
from .events import EventLog
from .gc_pause import collector_paused
from .plan_view import PlanView, load_plan
from .resume import restart_count
from .sampler import start_for
from .warm_start import FORKED_ENV

EXIT_OK = 0
EXIT_REQUEUE = 85
# Test hook (tests/test_rank_death.py): "RANK:CODE" makes that global rank exit
# with CODE before MPI_Init, as a rank dying during start-up would.
TEST_EXIT_BEFORE_MPI = "HETRUN_TEST_EXIT_BEFORE_MPI"


def _launcher_rank() -> str | None:
    for key in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(key, "").isdigit():
            return os.environ[key]
    return None


def _test_exit_before_mpi() -> None:
    rank, _, code = os.environ.get(TEST_EXIT_BEFORE_MPI, "").partition(":")
    if rank and rank == _launcher_rank():
        sys.stderr.write(f"hetrun.runtime: {TEST_EXIT_BEFORE_MPI} set: rank {rank} exits {code} before MPI_Init\n")
        sys.stderr.flush()
        os._exit(int(code or 1))


def has_work(plan: PlanView) -> bool:
    return plan.iterations > 0 and bool(plan.actions)


def process_start_time() -> float | None:
    """When this process was created (wall clock, 10 ms ticks), from /proc; None elsewhere.

    Field 22 of /proc/self/stat is the start in clock ticks of CLOCK_BOOTTIME;
    the wall clock now minus the boot clock now dates it (/proc/stat's btime
    is rounded to the second: too coarse here). No psutil needed.
    """
    try:
        stat = Path("/proc/self/stat").read_text()
        # The command name (field 2) may hold spaces: count fields after its ')'.
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def env_time(name: str) -> float | None:
    """A time the batch script exported from bash's $EPOCHREALTIME (a locale may use ',')."""
    raw = os.environ.get(name, "").replace(",", ".")
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def startup_times(world: object, interp_ready: float | None) -> dict[str, float | None]:
    """Every startup stage this rank can date, in the order they happen.

    batch_start/srun_start come from the sbatch script (absent under the local
    backend); the rest from this process. ``hetrun report`` and
    benchmarks/requeue_bench.py break a restart down with them.
    """
    times: dict[str, float | None] = {
        "batch_start": env_time("HETRUN_BATCH_START"),
        "srun_start": env_time("HETRUN_SRUN_START"),
        "proc_start": process_start_time(),
        "interp_ready": interp_ready,
    }
    times.update(getattr(world, "timings", {}))
    return times


def run_rank(run_dir_arg: str, *, interp_ready: float | None = None) -> int:
    run_dir = Path(run_dir_arg).resolve()
    if not run_dir.is_dir():
        sys.stderr.write(f"hetrun.runtime: error: run directory {run_dir} does not exist\n")
        return RunDirError.exit_code
    restarts = restart_count()
    try:
        # A requeued attempt runs the plan.json its first attempt validated:
        # skipping the planner's check there saves ~0.3 s of imports per rank.
        plan = load_plan(run_dir, validate=restarts == 0)
    except HetrunError as exc:
        sys.stderr.write(f"hetrun.runtime: error: {exc}\n")
        return exc.exit_code
    for key, value in plan.env.items():
        # The batch script exports the job's env already; this covers mpirun/local.
        os.environ.setdefault(key, value)

    from .world import build_world

    _test_exit_before_mpi()
    try:
        world = build_world(plan)
    except HetrunError as exc:
        sys.stderr.write(f"hetrun.runtime: error: {exc}\n")
        _abort_world(exc.exit_code)
        return exc.exit_code

    log = EventLog(
        run_dir, rank=world.rank, component=world.component.name, node=world.node,
    )
    _announce(log, world, restarts)
    started = time.time()
    if not has_work(plan):
        log.emit("exit", code=EXIT_OK, reason="plan has nothing to execute",
                 elapsed=time.time() - started)
        mpi_wait.meet(world.comm)
        return EXIT_OK
    return _execute(plan, world, log, run_dir, restarts, started, interp_ready)


def _announce(log: EventLog, world: Any, restarts: int) -> None:
    """The rank's ``start`` event and its one line in the rank's log."""
    log.emit(
        "start",
        size=world.size,
        comp_rank=world.comp_rank,
        comp_size=world.comp_size,
        node_rank=world.node_rank,
        node_size=world.node_size,
        pid=os.getpid(),
        host=os.uname().nodename,
        job_id=os.environ.get("SLURM_JOB_ID"),
        restart_count=restarts,
        cpus=world.component.cpus_per_task,
        gpus=world.component.gpus_per_node,
    )
    print(
        f"hetrun.runtime: rank {world.rank}/{world.size} component {world.component.name} "
        f"(rank {world.comp_rank}/{world.comp_size}) on {world.node}",
        flush=True,
    )


def _execute(plan: PlanView, world: Any, log: EventLog, run_dir: Path, restarts: int, started: float,
             interp_ready: float | None) -> int:
    """Import torch, run the executor, and end the rank with its exit code."""
    # torch is what every workload needs and the longest import of a start:
    # dated here so the startup event shows it apart from process groups.
    world.timings["torch_import_start"] = time.time()
    with collector_paused(then_freeze=True):  # runtime/gc_pause.py: the imports' objects are not garbage
        import torch  # noqa: F401

        world.timings["torch_imported"] = time.time()
        from .executor import Executor, RankFailed

    try:
        executor = Executor(plan, world, log, run_dir)
        log.emit("startup", restart_count=restarts, executor_ready=time.time(),
                 cpu_s=round(time.process_time(), 3), warm_start=FORKED_ENV in os.environ,
                 **startup_times(world, interp_ready))
        sampler = start_for(log, world)  # resource samples for `hetrun report`
        code = executor.run()
        sampler.stop()
    except RankFailed as exc:
        _report_failure(log, exc.action, exc.iteration, exc.cause, world, exc.waiting_on)
        return 1  # unreachable: _report_failure aborts
    except BaseException as exc:
        _report_failure(log, None, None, exc, world)
        return 1
    log.emit("exit", code=code, elapsed=time.time() - started, restart_count=restarts)
    world.shutdown()
    if code != EXIT_OK:
        mpi_wait.meet(world.comm)  # every peer has flushed its checkpoint (see the module doc)
    return code


def _report_failure(log: EventLog, action: str | None, iteration: int | None,
                    exc: BaseException, world: object, waiting_on: list[int] | None = None) -> None:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    code = exc.exit_code if isinstance(exc, HetrunError) else 6
    try:
        log.emit("error", action=action, iteration=iteration, error=f"{type(exc).__name__}: {exc}",
                 traceback=tb, code=code)
        log.emit("rank_failure", signal=None, exit_code=code, detected_by="runtime",
                 restart_count=restart_count(), action=action, iteration=iteration,
                 message=f"{type(exc).__name__}: {exc}", t=time.time(),
                 # a timed-out wait: the ranks it waited for (node recovery blames their nodes)
                 **({"waiting_on": waiting_on} if waiting_on else {}))
    finally:
        where = f" in action {action} (iteration {iteration})" if action else ""
        rank = getattr(world, "rank", "?")
        comp = getattr(getattr(world, "component", None), "name", "?")
        sys.stderr.write(
            f"hetrun.runtime: error: rank {rank} ({comp}){where} failed: "
            f"{type(exc).__name__}: {exc}\n{tb}"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        _abort_world(code)


def _abort_world(code: int) -> None:
    """MPI_Abort ends every rank of the job now (a peer in a collective would hang)."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)

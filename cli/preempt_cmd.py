"""`hetrun preempt RUN`: send a run its documented stop signal, as a preemption warning would.

The signal is plan.json's ``preemption.signal`` (USR1 by default). A Slurm run gets it
like ``--signal=B:USR1@N`` delivers it (``scancel --batch --signal=USR1 JOBID``): the
batch shell forwards it to every rank; a local run's supervisor gets it and forwards it
the same way. Every rank agrees a stop step, checkpoints and exits 85; the post-mortem
requeues the run (Slurm: ``scontrol requeue``; local: the supervisor starts the next
attempt), which resumes from that checkpoint. ``--wait`` waits for the attempt's
``attempt_end`` line and prints it. Thin: the signalling is in the backends.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

RunsDirOpt = Annotated[Optional[Path], typer.Option(
    "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
    help="Where run directories live (default ./runs).")]


def stop_signal(run_dir: Path) -> str:
    """The run's agreed stop signal (plan.json ``preemption.signal``), validated, without SIG."""
    from hetrun.runtime.plan_view import load_plan
    from hetrun.slurm_plugin.quoting import signal_name

    pre = load_plan(run_dir, validate=False).preemption  # RunDirError names a missing/damaged plan.json
    return signal_name(str(pre.get("signal") or "USR1").upper().removeprefix("SIG"))


def wait_attempt_end(run_dir: Path, seen: int, timeout_s: float) -> dict[str, Any] | None:
    """The first ``attempt_end`` line after the ``seen`` ones already there, or None at timeout."""
    from hetrun.slurm_plugin.rundir import events_of

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ends = events_of(run_dir, ("attempt_end",))
        if len(ends) > seen:
            return ends[seen]
        time.sleep(0.5)
    return None


def register(app: typer.Typer) -> None:
    @app.command()
    def preempt(
        ref: Annotated[str, typer.Argument(metavar="RUN", help="Run directory, run name (prefix) or Slurm job id.")],
        runs_dir: RunsDirOpt = None,
        wait: Annotated[bool, typer.Option(
            "--wait", help="Wait until the attempt has checkpointed and ended; print how it ended.")] = False,
        wait_timeout: Annotated[float, typer.Option(
            "--wait-timeout", help="With --wait: give up after this many seconds.")] = 300.0,
    ) -> None:
        """Preempt a running run: it checkpoints at an agreed step and is requeued.

        Sends the run's stop signal (preemption.signal, USR1 by default) as Slurm's
        --signal warning would: to the batch shell of a Slurm run, to the supervisor of a
        local run. Every rank stops after the same step, saves, exits 85, and the run is
        requeued (local: the next attempt starts at once) and resumes from that checkpoint.
        """
        from hetrun.slurm_plugin.rundir import events_of, find_run, runs_root
        from hetrun.slurm_plugin.submit import backend_for

        from hetrun.errors import HetrunError

        run = find_run(ref, runs_root(runs_dir))
        run_dir = Path(run.run_dir)
        sig = stop_signal(run_dir)
        backend = backend_for(run)
        state = backend.status([run])[run.run_dir].state
        if state != "RUNNING":
            raise HetrunError(f"cannot preempt {run_dir.name}: it is {state}, not RUNNING",
                              hint="only a running run has ranks to checkpoint; see `hetrun status`")
        seen = len(events_of(run_dir, ("attempt_end",)))
        where = backend.preempt(run, sig)
        typer.echo(f"sent SIG{sig} to {where}: the ranks agree a stop step, checkpoint and exit 85; "
                   "the run is then requeued and resumes from that checkpoint")
        if not wait:
            return
        end = wait_attempt_end(run_dir, seen, wait_timeout)
        if end is None:
            raise HetrunError(f"{run_dir.name}: no attempt_end within {wait_timeout:g}s of the signal",
                              hint="a rank may ignore the stop; see `hetrun status` and the logs/ directory")
        typer.echo(f"attempt {end.get('restart_count')} ended: {end.get('outcome')}, "
                   f"requeued: {'yes' if end.get('requeued') else 'no'} ({end.get('reason')})")

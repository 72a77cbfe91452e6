"""`hetrun submit`: job YAML -> plan -> run directory -> one Slurm het job (or local run).

Script mode: ``hetrun submit train.py -N 2 --ntasks-per-node 2 -- --lr 3e-4`` makes a
one-component command job of the program (``hetrun.dag.script_job``), no YAML needed.

Thin: the work is in ``hetrun.slurm_plugin.submit``. Heavy imports happen
inside the command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from hetrun.cli.spec_options import (
    AccountOpt,
    ConstraintOpt,
    GresOpt,
    JobArg,
    NodesOpt,
    PartitionOpt,
    QosOpt,
    SetOpt,
    TimeOpt,
    load_job,
    overrides_from,
)

if TYPE_CHECKING:
    from hetrun.dag.overrides import Overrides
    from hetrun.dag.plan import Plan
    from hetrun.dag.spec import JobSpec
    from hetrun.slurm_plugin.rundir import RunInfo
    from hetrun.slurm_plugin.submit import SubmitResult

BackendOpt = Annotated[str, typer.Option(
    "--backend", "-b",
    help="auto (sbatch when a Slurm controller answers within 2 s, else local), sbatch, local or pyslurm.")]
ScriptArgs = Annotated[Optional[list[str]], typer.Argument(
    help="Script mode: arguments for the program, after --.", show_default=False, metavar="[-- ARGS...]")]
TasksPerNodeOpt = Annotated[Optional[int], typer.Option(
    "--ntasks-per-node", metavar="N",  # its range is the spec's (components.C.tasks_per_node)
    help="Script mode: ranks per node of the program (a YAML job: --set components.C.tasks_per_node=N).")]
RunsDirOpt = Annotated[Optional[Path], typer.Option(
    "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
    help="Where run directories are created (default ./runs).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        job: JobArg,
        script_args: ScriptArgs = None,
        partition: PartitionOpt = None,
        time: TimeOpt = None,
        account: AccountOpt = None,
        qos: QosOpt = None,
        nodes: NodesOpt = None,
        gres: GresOpt = None,
        constraint: ConstraintOpt = None,
        sets: SetOpt = None,
        backend: BackendOpt = "auto",
        runs_dir: RunsDirOpt = None,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Print the script and the command; create and submit nothing.")] = False,
        wait: Annotated[bool, typer.Option(
            "--wait", help="Wait until every component has ended; exit non-zero unless all COMPLETED.")] = False,
        wait_timeout: Annotated[Optional[float], typer.Option(
            "--wait-timeout", help="With --wait: give up waiting after this many seconds.")] = None,
        tasks_per_node: TasksPerNodeOpt = None,
        fit: Annotated[bool, typer.Option(
            "--fit", help="Place every component on the partition and GPU type of the pool expected to "
                          "start it first, as placement: auto does (the choice goes into plan.json).")] = False,
    ) -> None:
        """Submit a job: one Slurm heterogeneous job with a component per resource group.

        JOB may also be a program (a .py file or an executable): it becomes a one-component
        command job with torchrun's variables on every rank (script mode).
        """
        from hetrun.slurm_plugin.submit import submit_spec

        overrides = overrides_from(partition, time, account, qos, nodes, gres, constraint, sets)
        spec, job_dir = _spec_and_dir(job, script_args, tasks_per_node, overrides)
        if spec.checkpoint.object_store is not None:  # reachable, bucket there, writable: before any queue
            from hetrun.runtime.ckpt.object_preflight import preflight

            preflight(spec.checkpoint.object_store, str(job))
        if backend == "auto":
            from hetrun.slurm_plugin.backends import choose_auto

            choice = choose_auto()
            sys.stderr.write(f"hetrun: backend auto -> {choice.name}: {choice.reason}\n")
            backend = choice.name
        result = submit_spec(spec, backend=backend, runs_dir=runs_dir, dry_run=dry_run, job_dir=job_dir, fit=fit,
                             job_file=str(job))
        print_placement(result.plan, spec)
        if result.dry_run is not None:
            _print_dry_run(result)
            return
        run = result.run
        typer.echo(f"submitted {run.name} as job {run.job_id} ({result.backend})")
        typer.echo(f"run directory: {run.run_dir}")
        if wait:
            _wait(run, wait_timeout)


def _spec_and_dir(job: Path, script_args: list[str] | None, tasks_per_node: int | None,
                  overrides: Overrides) -> tuple[JobSpec, Path]:
    """The job spec, and the directory its ranks run in (the YAML's, or where a script was submitted)."""
    from hetrun.dag.script_job import is_script, script_spec

    if is_script(job):
        spec = script_spec(job, script_args or [], python=sys.executable, tasks_per_node=tasks_per_node,
                           overrides=overrides)
        return spec, Path.cwd()  # the program runs where you submitted it, as sbatch does
    from hetrun.errors import SpecError

    if script_args or tasks_per_node is not None:
        what = "--ntasks-per-node" if tasks_per_node is not None else f"arguments {script_args}"
        raise SpecError(f"{what} apply to script mode (a .py or executable job file), not to {job}",
                        hint="for a job YAML use --set components.<name>.tasks_per_node=N")
    return load_job(job, overrides), Path(job).parent


def placement_lines(plan: Plan | None, spec: JobSpec | None = None) -> list[str]:
    """One line per placed component: where it goes and why (the words `hetrun report` uses).
    With ``spec``, its ``placement:`` says the mode (a fixed one placed only because of ``--fit``
    reads "by --fit"); without, a recorded ranked list says ranked, else auto."""
    from hetrun.reports.placement import component_row, row_lines

    modes = {n: c.placement for n, c in spec.components.items()} if spec is not None else {}
    return [row_lines(component_row(comp.model_dump(mode="json"), modes.get(comp.name)
                                    or ("ranked" if comp.placement.ranked else "auto"), None))[0]
            for comp in (plan.components if plan is not None else []) if comp.placement is not None]


def print_placement(plan: Plan | None, spec: JobSpec | None = None) -> None:
    """Where each placed component goes and why (stderr: a dry run's stdout is the script)."""
    for line in placement_lines(plan, spec):
        sys.stderr.write(f"hetrun: {line}\n")


def _print_dry_run(result: SubmitResult) -> None:
    import shlex

    dr = result.dry_run
    assert dr is not None
    typer.echo(result.script, nl=False)
    sys.stderr.write(f"hetrun: dry run ({dr.backend}); would run: {shlex.join(dr.command)}\n")
    for note in dr.notes:
        sys.stderr.write(f"hetrun:   {note}\n")
    sys.stderr.write(f"hetrun: nothing was written; the run directory would be {result.run.run_dir}\n")


def _wait(run: RunInfo, wait_timeout: float | None) -> None:
    """Wait for the end; never a bare FAILED: the failing rank and its own error line."""
    from hetrun.slurm_plugin.backends.base import RunStatus
    from hetrun.slurm_plugin.submit import backend_for, wait_for_end

    def show(status: RunStatus) -> None:
        parts = ", ".join(f"{c.name}={c.state}" for c in status.components)
        typer.echo(f"  {parts}")

    final = wait_for_end(run, backend_for(run), timeout_s=wait_timeout, on_change=show)
    if any(c.state != "COMPLETED" for c in final.components):
        from hetrun.reports.attempts import status_details

        failure = status_details(run.run_dir)[2]
        why = failure.text if failure else f"no rank failure recorded; see `hetrun report {run.run_dir}`"
        typer.echo(f"hetrun: {run.name} ended {final.state}: {why}", err=True)
        raise typer.Exit(1)

"""`hetrun cancel RUN_OR_JOBID`: end every component of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

RunsDirOpt = Annotated[Optional[Path], typer.Option(
    "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
    help="Where run directories live (default ./runs).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def cancel(
        ref: Annotated[str, typer.Argument(
            metavar="RUN_OR_JOBID", help="Run directory, run name (prefix) or Slurm job id.")],
        runs_dir: RunsDirOpt = None,
    ) -> None:
        """Cancel a run (all of its het components)."""
        from hetrun.slurm_plugin.rundir import find_run, runs_root
        from hetrun.slurm_plugin.submit import backend_for

        from hetrun.errors import RunDirError

        root = runs_root(runs_dir)
        try:
            run = find_run(ref, root)
        except RunDirError:
            head = ref.split("+", 1)[0]
            if not head.isdigit():
                raise
            # A job id hetrun has no run directory for (submitted elsewhere): like scancel.
            from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
            from hetrun.slurm_plugin.backends.slurm_cli import run_slurm

            run_slurm(["scancel", head], SbatchBackend().policy)
            typer.echo(f"cancelled Slurm job {head} (no hetrun run directory under {root})")
            return
        backend_for(run).cancel(run)
        typer.echo(f"cancelled {Path(run.run_dir).name} (job {run.job_id}, {run.backend})")

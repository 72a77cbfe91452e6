"""`hetrun status [RUN...]`: per run and per het component, state, nodes, elapsed, restarts.

This module is only the Typer command (options, help, --watch); the body is
cli/status_show.py, which the console script calls without Typer for the plain forms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

RunsDirOpt = Annotated[Optional[Path], typer.Option(
    "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
    help="Where run directories live (default ./runs).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        runs: Annotated[Optional[list[str]], typer.Argument(
            help="Runs: directory, name (prefix) or Slurm job id. Default: every run under --runs-dir.",
            show_default=False)] = None,
        runs_dir: RunsDirOpt = None,
        last: Annotated[int, typer.Option(
            "--last", "-n", help="Without RUN arguments: show only the newest N runs (0 = all).")] = 20,
        watch: Annotated[bool, typer.Option(
            "--watch", "-w", help="Live view (progress, rate, ETA, last checkpoint, restarts, metrics) "
                                  "until the runs end or Ctrl-C; plain lines when not a terminal.")] = False,
        interval: Annotated[float, typer.Option(
            "--interval", min=0.2, help="Seconds between refreshes of --watch.")] = 2.0,
        as_json: Annotated[bool, typer.Option(
            "--json", help="Print the runs as JSON: per component the scheduler's state and the placement "
                           "(as `hetrun report --json` has it).")] = False,
    ) -> None:
        """Show the state of each het component of your runs."""
        if watch and as_json:
            raise typer.BadParameter("--json prints the state once; leave out --watch", param_hint="--json")
        from hetrun.cli.status_show import show_status

        show_status(runs, runs_dir, last, as_json, watch=watch, interval=interval)

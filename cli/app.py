"""The ``hetrun`` command line.

Commands live in small modules (``*_cmd.py``), each with ``register(app)``.
Modules import only typer at the top; anything heavy (torch, mpi4py, the
Slurm backends) is imported inside the command that needs it, so
``hetrun --help`` and ``hetrun status`` start fast.

Library code raises ``HetrunError``; the console script (cli/entry.py) is the
one place that turns it into a message on stderr and an exit code. No
tracebacks for user errors.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="hetrun",
    help="Fine-grained training DAGs on Slurm heterogeneous jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Modules that contribute commands. Each is part of the package: a missing or
# broken one is a packaging error and fails loudly, never a silently absent command.
_COMMAND_MODULES = (
    "plan_cmd",
    "submit_cmd",
    "status_cmd",
    "cancel_cmd",
    "preempt_cmd",
    "report_cmd",
    "cluster_cmd",
    "ckpt_cmd",
    "tune_cmd",
    "resume_cmd",
    "pool_cmd",
    "policy_cmd",
)


@app.callback()
def _root() -> None:
    """Fine-grained training DAGs on Slurm heterogeneous jobs."""


@app.command()
def version() -> None:
    """Print hetrun's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _pkg_version

    try:
        typer.echo(_pkg_version("hetrun"))
    except PackageNotFoundError:
        typer.echo("unknown (not installed)")


for _name in _COMMAND_MODULES:
    importlib.import_module(f"hetrun.cli.{_name}").register(app)


def main(argv: list[str] | None = None) -> None:
    """The Typer application with hetrun's error handling (``hetrun.cli.entry.main``)."""
    from hetrun.cli.entry import main as entry_main

    entry_main(argv)

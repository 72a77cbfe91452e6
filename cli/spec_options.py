"""Job-spec override options shared by ``hetrun plan`` and ``hetrun submit``.

The flags are the ones sbatch users already type. A command declares them by
using these ``Annotated`` aliases as parameter types, then calls
``load_job(job, overrides_from(...))``::

    def submit(job: JobArg, partition: PartitionOpt = None, time: TimeOpt = None,
               account: AccountOpt = None, qos: QosOpt = None, nodes: NodesOpt = None,
               gres: GresOpt = None, constraint: ConstraintOpt = None, sets: SetOpt = None): ...
        spec = load_job(job, overrides_from(partition, time, account, qos, nodes, gres,
                                            constraint, sets))

Only typer is imported at module level (start-up time).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from hetrun.dag.overrides import Overrides
    from hetrun.dag.spec import JobSpec

_PANEL = "Overrides (sbatch-style)"

JobArg = Annotated[Path, typer.Argument(help="Job YAML file.", show_default=False, metavar="JOB.yaml")]
PartitionOpt = Annotated[Optional[str], typer.Option(
    "-p", "--partition", metavar="PARTITION", help="Partition (slurm.partition).", rich_help_panel=_PANEL)]
TimeOpt = Annotated[Optional[str], typer.Option(
    "-t", "--time", metavar="TIME", help="Time limit, e.g. 00:30:00 or 1-00:00 (slurm.time).", rich_help_panel=_PANEL)]
AccountOpt = Annotated[Optional[str], typer.Option(
    "-A", "--account", metavar="ACCOUNT", help="Account to charge (slurm.account).", rich_help_panel=_PANEL)]
QosOpt = Annotated[Optional[str], typer.Option(
    "-q", "--qos", metavar="QOS", help="Slurm QOS (slurm.qos).", rich_help_panel=_PANEL)]
NodesOpt = Annotated[Optional[list[str]], typer.Option(
    "-N", "--nodes", metavar="[COMPONENT=]N", help="Nodes: N for the first component, or COMPONENT=N. Repeatable.",
    rich_help_panel=_PANEL)]
GresOpt = Annotated[Optional[list[str]], typer.Option(
    "--gres", metavar="[COMPONENT=]gpu:N", help="gpu:N for the first GPU component, or COMPONENT=gpu:N. Repeatable.",
    rich_help_panel=_PANEL)]
ConstraintOpt = Annotated[Optional[str], typer.Option(
    "-C", "--constraint", metavar="FEATURES", help="Node features (slurm.constraint).", rich_help_panel=_PANEL)]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="KEY.PATH=VALUE", help="Any key: key.path=value (value read as YAML), e.g. training.iterations=100. Repeatable.",
    rich_help_panel=_PANEL)]


def overrides_from(
    partition: str | None = None,
    time: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    nodes: list[str] | None = None,
    gres: list[str] | None = None,
    constraint: str | None = None,
    sets: list[str] | None = None,
) -> Overrides:
    """The ``Overrides`` for the parsed flag values (None = not given)."""
    from hetrun.dag.overrides import Overrides

    return Overrides(partition=partition, time=time, account=account, qos=qos,
                     constraint=constraint, nodes=list(nodes or []), gres=list(gres or []),
                     sets=list(sets or []))


def load_job(job: Path, overrides: Overrides | None = None) -> JobSpec:
    """Load and validate the job YAML with overrides; raises ``SpecError`` (exit code 2).
    A layout that holds but misleads (dag/spare_layout.py) is a warning line on stderr."""
    import sys

    from hetrun.dag.spare_layout import spare_layout_warnings
    from hetrun.dag.spec import load_spec

    spec = load_spec(job, overrides)
    for warning in spare_layout_warnings(spec):
        sys.stderr.write(f"hetrun: warning: {warning}\n")
    return spec

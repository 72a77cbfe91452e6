"""`hetrun resume RUN` and `hetrun resubmit RUN --resize ...`: continue a run as a new attempt.

Thin: ``hetrun.slurm_plugin.resume_run`` checks and submits; the runtime
restores the newest checkpoint (``hetrun.runtime.resize`` when rank counts
changed). Heavy imports happen inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from hetrun.cli.spec_options import (
    AccountOpt,
    PartitionOpt,
    QosOpt,
    SetOpt,
    TimeOpt,
    overrides_from,
)

if TYPE_CHECKING:
    from hetrun.dag.overrides import Overrides
    from hetrun.dag.plan import Plan
    from hetrun.slurm_plugin.resume_run import ResumePlan
    from hetrun.slurm_plugin.rundir import RunInfo

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run directory, run name (prefix) or job id.")]
RunsDirOpt = Annotated[Optional[Path], typer.Option(
    "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True, help="Where run directories live (default ./runs).")]
BackendOpt = Annotated[Optional[str], typer.Option(
    "--backend", "-b", help="Backend for the new job (default: the run's own).")]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", help="Print the script the new job would run; change and submit nothing.")]
WaitOpt = Annotated[bool, typer.Option(
    "--wait", help="Wait until the new job has ended; exit non-zero unless all COMPLETED.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def resume(run: RunArg, partition: PartitionOpt = None, time: TimeOpt = None, account: AccountOpt = None,
               qos: QosOpt = None, sets: SetOpt = None, backend: BackendOpt = None, runs_dir: RunsDirOpt = None,
               dry_run: DryRunOpt = False, wait: WaitOpt = False) -> None:
        """Continue a cancelled, failed or finished run from its newest checkpoint, as its next attempt.

        Same run directory, events and checkpoints; overrides may change what the
        checkpoint does not depend on (e.g. --set training.iterations=200, -t, -p).
        """
        _run(run, runs_dir, overrides_from(partition, time, account, qos, sets=sets), None, backend, dry_run, wait)

    @app.command()
    def resubmit(run: RunArg, resize: Annotated[str, typer.Option(
                     "--resize", metavar="auto|COMPONENT=N,...",
                     help="auto: the ranks `hetrun tune RUN` proposes; or explicit rank counts.")],
                 partition: PartitionOpt = None, time: TimeOpt = None, account: AccountOpt = None,
                 qos: QosOpt = None, sets: SetOpt = None, backend: BackendOpt = None, runs_dir: RunsDirOpt = None,
                 dry_run: DryRunOpt = False, wait: WaitOpt = False) -> None:
        """Resume a run with other rank counts per component (checkpoints restore into them)."""
        from hetrun.slurm_plugin.resume_run import parse_resize

        info = _find(run, runs_dir)
        auto_sets: list[str] = []
        if resize.strip() == "auto":
            sizes, auto_sets = _auto_sizes(info.path)
        else:
            sizes = parse_resize(resize)
        # tune's memory first, so a --set the user gives wins over it
        ov = overrides_from(partition, time, account, qos, sets=[*auto_sets, *(sets or [])])
        _run(run, runs_dir, ov, sizes, backend, dry_run, wait)


def _find(ref: str, runs_dir: Path | None) -> RunInfo:
    from hetrun.slurm_plugin.rundir import find_run, runs_root

    return find_run(ref, runs_root(runs_dir))


def _auto_sizes(run_dir: Path) -> tuple[dict[str, int], list[str]]:
    """`hetrun tune RUN`'s proposal (its defaults): ranks per component, and the
    ``--set`` lines giving each component the proposed memory."""
    from hetrun.reports.cost import load_prices, prices_path
    from hetrun.reports.demand.sizing import propose

    proposal = propose(run_dir, load_prices(prices_path(None)))
    sys.stderr.write("hetrun: tune proposes " + ", ".join(
        f"{c.name}={c.ranks} ({c.mem_mb}M a rank)" for c in proposal.proposed)
        + f" (demand: {proposal.predictor}; {proposal.decision}; cost per 1M {proposal.unit} "
        f"{proposal.cost_change:+.1%}" + (f": {proposal.reason}" if proposal.reason else "") + ")\n")
    sizes = {c.name: c.ranks for c in proposal.proposed}
    return sizes, [c.mem_set() for c in proposal.proposed]


def _changes(run_dir: Path, rp: ResumePlan) -> str:
    """What the new job changes in the components: ranks and memory, old -> new."""
    from hetrun.runtime.plan_view import load_plan

    old = {c["name"]: c for c in load_plan(run_dir, validate=False).raw.get("components", [])}
    out = [f"{c}: {a} -> {b} ranks" for c, (a, b) in rp.resized.items()]
    for comp in rp.plan.components:
        before = (old.get(comp.name) or {}).get("mem_mb")
        if before is not None and before != comp.mem_mb:
            out.append(f"{comp.name}: mem {before}M -> {comp.mem_mb}M")
    return "; ".join(out)


def _newest_step(run_dir: Path, plan: Plan) -> int | None:
    """The newest checkpoint step every component holds (what the ranks will restore)."""
    from hetrun.runtime.ckpt import open_store
    from hetrun.runtime.plan_view import checkpoint_root

    root = checkpoint_root(run_dir, plan.checkpoint.directory)
    common: set[int] | None = None
    for comp in plan.components:
        path = root / comp.name
        steps = set(open_store(path).steps()) if path.is_dir() else set()
        common = steps if common is None else common & steps
    return max(common) if common else None


def _run(ref: str, runs_dir: Path | None, overrides: Overrides, sizes: dict[str, int] | None, backend: str | None,
         dry_run: bool, wait: bool) -> None:
    from hetrun.slurm_plugin import resume_run

    info = _find(ref, runs_dir)
    rp = resume_run.prepare(info, overrides, resize=sizes, backend=backend)
    from hetrun.cli.submit_cmd import print_placement

    print_placement(rp.plan)
    step = _newest_step(info.path, rp.plan)
    where = f"checkpoint step {step}" if step is not None else "the beginning (no checkpoint every component holds)"
    sized = _changes(info.path, rp)
    if dry_run:
        typer.echo(rp.script, nl=False)
        sys.stderr.write(f"hetrun: dry run: would resume {info.path.name} as attempt {rp.restart} "
                         f"({rp.backend}) from {where}{'; ' + sized if sized else ''}; nothing was changed\n")
        return
    new = resume_run.submit(rp)
    typer.echo(f"resumed {info.path.name} as attempt {rp.restart}: job {new.job_id} ({rp.backend}), from {where}"
               + (f"; {sized}" if sized else ""))
    typer.echo(f"run directory: {new.run_dir}")
    if not wait:
        return
    from hetrun.slurm_plugin.submit import backend_for, wait_for_end

    final = wait_for_end(new, backend_for(new), on_change=lambda s: typer.echo(
        "  " + ", ".join(f"{c.name}={c.state}" for c in s.components)))
    if any(c.state != "COMPLETED" for c in final.components):
        raise typer.Exit(1)

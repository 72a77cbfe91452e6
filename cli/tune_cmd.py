"""`hetrun tune RUN`: component sizes that balance the pipeline at the lowest cost per env step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def tune(
        run: Annotated[str, typer.Argument(metavar="RUN", help="Run directory, run name (prefix) or job id.")],
        runs_dir: Annotated[Optional[Path], typer.Option(
            "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
            help="Where run directories live (default ./runs).")] = None,
        margin: Annotated[float, typer.Option(
            "--margin", min=0.0, help="Memory headroom over the measured peak (0.25 = +25%).")] = 0.25,
        max_cores: Annotated[Optional[int], typer.Option(
            "--max-cores", min=1, help="Cores the proposal may use (default: the measured job's).")] = None,
        skip: Annotated[int, typer.Option(
            "--skip", min=0, help="Start-up iterations left out of the demand.")] = 1,
        model: Annotated[Optional[Path], typer.Option(
            "--model", help="A demand LSTM (JSON, from benchmarks/demand_prediction.py --save); "
                            "default: EWMA of the busy seconds.")] = None,
        prices: Annotated[Optional[Path], typer.Option(
            "--prices", envvar="HETRUN_PRICES", show_envvar=True,
            help="Price table YAML (as `hetrun report`).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the proposal as JSON.")] = False,
    ) -> None:
        """Propose ranks and memory per component from the run's measured demand, with the expected effect.

        `hetrun resubmit RUN --resize auto` resumes the same run with these sizes.
        """
        import json

        from hetrun.reports.cost import load_prices, prices_path
        from hetrun.reports.demand.sizing import propose

        run_dir = _resolve(run, runs_dir)
        predictor = None
        if model is not None:
            from hetrun.reports.demand.lstm import load_chooser

            predictor = load_chooser(model)
        result = propose(run_dir, load_prices(prices_path(prices)), predictor=predictor, margin=margin,
                         max_cores=max_cores, skip=skip)
        if as_json:
            typer.echo(json.dumps(result.to_json(), indent=2))
            return
        _print(result)


def _resolve(ref: str, runs_dir: Path | None) -> Path:
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    from hetrun.slurm_plugin.rundir import find_run, runs_root

    return Path(find_run(ref, runs_root(runs_dir)).run_dir)


def _print(p: object) -> None:
    from hetrun.reports.demand.sizing import Proposal
    from rich.console import Console
    from rich.table import Table

    assert isinstance(p, Proposal)
    table = Table(title=f"hetrun tune {Path(p.run_dir).name}  (demand: {p.predictor})")
    for col in ("component", "ranks", "cpus/task", "mem/rank", "busy s/1k steps", "utilization"):
        table.add_column(col, justify="left" if col == "component" else "right")
    for now, new in zip(p.current, p.proposed, strict=True):
        table.add_row(now.name, f"{now.ranks} -> {new.ranks}", str(new.cpus_per_task),
                      f"{now.mem_mb}M -> {new.mem_mb}M", f"{now.busy_s_per_step * 1000:.3f}",
                      f"{now.utilization:.0%} -> {new.utilization:.0%}")
    console = Console()
    console.print(table)
    for line in proposal_lines(p):
        console.print(line, markup=False, highlight=False)
    if p.decision == "resize":
        console.print(f"resume this run with these sizes: hetrun resubmit {p.run_dir} --resize auto")
        console.print("or a new run: hetrun submit JOB.yaml " + " ".join(f"--set {o}" for o in p.overrides()))
    elif any(new.mem_mb != now.mem_mb for now, new in zip(p.current, p.proposed, strict=True)):
        # Ranks kept, but a rank measured more memory than its component asks for.
        console.print("a new run with the memory raised: hetrun submit JOB.yaml "
                      + " ".join(f"--set {o}" for o in p.overrides()))


def proposal_lines(p: object) -> list[str]:
    """What tune measured, what its model predicts and how sure it is; a cut printed as a cut."""
    from hetrun.reports.demand.sizing import Proposal

    assert isinstance(p, Proposal)
    u = p.unit
    sizes = " ".join(f"{c.name}={c.ranks}" for c in p.current)
    spread = (f" (windows {p.measured_spread[0]:,.0f}-{p.measured_spread[1]:,.0f}, +/-{p.relative_spread:.1%})"
              if p.measured_spread and p.relative_spread is not None else "")
    whole = (f"; whole run {p.whole_run_steps_per_s:,.0f} (start-up and queue gaps included, not modelled)"
             if p.whole_run_steps_per_s else "")
    out = [f"measured, attempt {p.attempt} [{sizes}]: steady {p.measured_steps_per_s:,.0f} {u}/s{spread}{whole}"]
    if p.model_error is not None:
        out.append(f"model for these sizes: {p.current_steps_per_s:,.0f} {u}/s ({p.model_error:+.1%} vs measured "
                   f"steady); predictions below are scaled by {p.calibration:.2f}")
    else:
        out.append(f"model for these sizes: {p.current_steps_per_s:,.0f} {u}/s (no steady measurement to check it)")
    verb = "keep" if p.decision == "keep" else "resize"
    out.append(f"proposal: {verb}" + (f": {p.reason}" if p.reason else ""))
    out.append(f"  {u}/s: {p.measured_steps_per_s:,.0f} measured -> {p.predicted_steps_per_s:,.0f} predicted")
    out.append(f"  cost per 1M {u}: {p.current_cost_per_m:.4f} -> {p.proposed_cost_per_m:.4f} {p.currency} "
               f"({p.cost_change:+.1%} cost)")
    out += [f"note: {n}" for n in p.notes]
    return out

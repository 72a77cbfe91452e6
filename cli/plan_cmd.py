"""`hetrun plan` (the action DAG, priorities, het components and sbatch script of a job)
and `hetrun schema` (JSON Schema of the job YAML).

Thin: the planning is in ``hetrun.dag``; node capacities come from
``hetrun.slurm_plugin.inventory`` when a cluster answers, the script from
``hetrun.slurm_plugin.render``. Heavy imports happen inside the commands.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
import time
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
    from collections.abc import Callable

    from hetrun.dag.action import NodeCapacity
    from hetrun.dag.plan import Plan, PlanBuild, PlanDep
    from hetrun.dag.spec import JobSpec
    from hetrun.slurm_plugin.backends import BackendChoice
    from rich.console import Console

# --unroll prints one line per dispatch; beyond this the table is cut (the counts stay exact).
_MAX_UNROLL_ROWS = 400
# The rank-level window is built to report its size and scheduling cost; beyond this
# it would only cost memory (about 100 bytes per action).
_MAX_SCALE_ACTIONS = 5_000_000


def _capacities(spec: JobSpec, mode: str, job: Path,
                probe: Callable[[], BackendChoice]) -> tuple[list[NodeCapacity] | None, str]:
    """Node capacities to check against and where they came from; first the mistakes
    ``hetrun submit`` would refuse before the queue (``slurm_plugin.prequeue``): a partition
    the cluster does not have (when a controller answers), a command's missing program or
    script (and, when the job is bound for a cluster, one under a node-private /tmp).
    ``probe()``: whether a controller answers; sinfo is asked only when one does (without one
    it waits out its 5 s timeout)."""
    from hetrun.slurm_plugin.prequeue import check_commands, check_partitions

    if mode == "spec":
        check_commands(spec, job.parent, to_slurm=False, search_path=False, file=str(job))
        return None, "the job spec (--capacity spec)"
    from hetrun.slurm_plugin.inventory import capacities_of, node_inventory

    answer = probe()
    nodes = node_inventory() if answer.name == "sbatch" else None
    check_partitions(spec, nodes, file=str(job))
    bound = nodes is not None  # a controller answered: the job goes to it, with this PATH
    check_commands(spec, job.parent, to_slurm=bound, search_path=bound, file=str(job))
    if nodes is None:
        why = "sinfo did not answer" if answer.name == "sbatch" else answer.reason
        if mode == "cluster":
            from hetrun.errors import SlurmError

            raise SlurmError(f"--capacity cluster: no Slurm cluster to ask ({why})",
                             hint="start one (hetrun cluster up) or use --capacity auto")
        return None, f"the job spec (no cluster: {why}; partitions not checked)"
    part = spec.slurm.partition or "the default partition"
    caps = capacities_of(nodes, spec.slurm.partition)
    if caps is None:  # every named partition exists (checked above) but holds no node
        return None, f"the job spec (sinfo lists no node in {part})"
    return caps, f"sinfo: {len(caps)} nodes of {part}"


def _placed_plan(build: PlanBuild, spec: JobSpec, fit: bool,
                 probe: Callable[[], BackendChoice]) -> tuple[Plan, list[str]]:
    """plan.json as ``hetrun submit`` would write it: the ``placement: auto`` components (every
    one with ``--fit``) placed against the pool by submit's own fit step (``placement_fit.place``),
    when a controller answers; otherwise unplaced, and notes saying which and why."""
    from hetrun.slurm_plugin.placement_fit import auto_components, place

    plan = build.plan
    names = auto_components(spec, fit)
    if not names:
        return plan, []
    from hetrun.slurm_plugin.backends import get_backend

    from hetrun.errors import SlurmError

    answer = probe()
    why = answer.reason
    if answer.name == "sbatch":
        try:
            return place(spec, plan, get_backend("sbatch"), fit_all=fit), []
        except SlurmError as exc:  # the controller answered the probe but not the pool's queries
            why = str(exc).splitlines()[0]
    return plan, [f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not placed in this script "
                    f"(their het blocks show the YAML's partition and an untyped GPU request): {why}",
                    "hetrun submit places them against the pool of the moment (and refuses them when "
                    "no controller answers)"]


def _render_script(plan: Plan, spec: JobSpec, runs_dir: Path | None) -> tuple[str, str]:
    from hetrun.slurm_plugin.render import render_sbatch
    from hetrun.slurm_plugin.rundir import new_run_name, runs_root

    run_dir = runs_root(runs_dir).resolve() / new_run_name(spec.name)
    return render_sbatch(plan, spec, run_dir), f"run directory (created by hetrun submit): {run_dir}"


def _deps_text(deps: list[PlanDep]) -> str:
    parts = []
    for d in deps:
        text = d.id if d.lag == 0 else f"{d.id}@-{d.lag}"
        if d.kind != "data":
            text += f" ({d.kind})"
        parts.append(text)
    return ", ".join(parts) or "-"


def _print_plan(console: Console, build: PlanBuild, spec: JobSpec, cap_source: str) -> None:
    from rich.table import Table

    plan = build.plan
    t = plan.training
    if t is None:
        console.print(f"[bold]{plan.name}[/bold]  command components only (no workload, no action DAG)")
    else:
        console.print(f"[bold]{plan.name}[/bold]  workload {plan.workload}  "
                      f"({t.kind}, {t.iterations} iterations, {t.micro_batches} micro-batches, "
                      f"pipeline window {t.pipeline_window}, {t.mode})")
    console.print(f"resources checked against {cap_source}")

    comps = Table(title="het components (one hetjob group each)", title_justify="left")
    for col in ("group", "component", "nodes", "tasks/node", "ntasks", "cpus/task", "gpus/node", "mem/node", "runs"):
        comps.add_column(col, justify="right" if col not in ("component", "runs") else "left",
                         overflow="fold")
    for c in plan.components:
        runs = f"command: {shlex.join(c.command)}" if c.command is not None else ", ".join(c.actions)
        comps.add_row(str(c.index), c.name, str(c.nodes), str(c.tasks_per_node), str(c.ntasks),
                      str(c.cpus_per_task), str(c.gpus_per_node), f"{c.mem_mb} MB", runs)
    console.print(comps)
    if t is None:
        return

    acts = Table(title="action DAG per iteration, in scheduling order (dep@-k = of iteration i-k)",
                 title_justify="left")
    for col in ("#", "action", "component", "deps", "tol", "qos", "priority", "every"):
        acts.add_column(col, justify="right" if col in ("#", "tol", "priority", "every") else "left",
                        overflow="fold")
    by_id = {a.id: a for a in plan.actions}
    for pos, aid in enumerate(plan.order):
        a = by_id[aid]
        acts.add_row(str(pos), a.id, a.component, _deps_text(a.deps), str(a.tolerance_window), a.qos,
                     f"{a.priority:.4f}", str(a.every))
    console.print(acts)
    if plan.memory is not None:
        m = plan.memory
        budget = f"{m.budget_mb} MB" if m.budget_mb is not None else "not given"
        console.print(f"peak {m.resource} per rank of {m.component}: {m.peak_before_mb} MB before 1F1B -> "
                      f"{m.peak_after_mb} MB after ({m.inflight_after} of {m.inflight_before} micro-batches "
                      f"in flight; budget {budget})")
    console.print(f"priority = {plan.schedule.qos_weight} x qos + {plan.schedule.util_weight} x utilization")


def _print_explain(console: Console, build: PlanBuild) -> None:
    from rich.columns import Columns
    from rich.panel import Panel

    console.print("[bold]compiler passes[/bold]")
    for i, report in enumerate(build.passes, 1):
        console.print(f"({i}) {report.name}: {report.summary}")
        for note in report.notes:
            console.print(f"    note: {note}")
        console.print(Columns([
            Panel("\n".join(report.before), title="before", expand=True),
            Panel("\n".join(report.after), title="after", expand=True),
        ], equal=True, expand=True))


def _print_unroll(console: Console, build: PlanBuild, iterations: int) -> None:
    from hetrun.dag.unroll import schedule_order, unroll

    plan = build.plan
    g = unroll(plan, iterations)
    order = schedule_order(g, [a.priority for a in plan.actions])
    console.print(f"[bold]unrolled over {iterations} iterations[/bold]: {len(g)} dispatches, {g.n_edges} edges")
    preds = g.predecessors()
    for pos, node in enumerate(order[:_MAX_UNROLL_ROWS]):
        deps = ", ".join(g.name(p) for p in preds[node]) or "-"
        console.print(f"{pos:>5}  {g.name(node)}  <- {deps}", highlight=False)
    if len(order) > _MAX_UNROLL_ROWS:
        console.print(f"... {len(order) - _MAX_UNROLL_ROWS} more")


def _print_scale(console: Console, build: PlanBuild) -> None:
    """Rank-level size of the pipeline window: what the runtime really executes."""
    from hetrun.dag.unroll import schedule_order, unroll

    plan = build.plan
    window = plan.training.pipeline_window
    ntasks = {c.name: c.ntasks for c in plan.components}
    estimate = sum(ntasks[a.component] for it in range(window) for a in plan.actions if a.runs_at(it))
    if estimate > _MAX_SCALE_ACTIONS:
        console.print(f"pipeline window across all ranks: {estimate} rank-level actions "
                      f"(not materialized here: more than {_MAX_SCALE_ACTIONS})")
        return
    t0 = time.perf_counter()
    g = unroll(plan, window, per_rank=True)
    t1 = time.perf_counter()
    schedule_order(g, [a.priority for a in plan.actions])
    t2 = time.perf_counter()
    per = (t2 - t1) / max(1, len(g)) * 1e6
    console.print(f"pipeline window ({window} iteration{'' if window == 1 else 's'}) across all ranks: {len(g)} rank-level actions, "
                  f"{g.n_edges} edges; unrolled in {(t1 - t0) * 1e3:.0f} ms, scheduled in "
                  f"{(t2 - t1) * 1e3:.0f} ms ({per:.2f} µs/action)")


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        job: JobArg,
        partition: PartitionOpt = None,
        time_limit: TimeOpt = None,
        account: AccountOpt = None,
        qos: QosOpt = None,
        nodes: NodesOpt = None,
        gres: GresOpt = None,
        constraint: ConstraintOpt = None,
        sets: SetOpt = None,
        explain: Annotated[bool, typer.Option("--explain", help="Show each compiler pass before/after, and each "
                                              "component's placement candidates with score, start estimate and "
                                              "why each lost (needs only, without a cluster).")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print only plan.json.")] = False,
        unroll_n: Annotated[Optional[int], typer.Option(
            "--unroll", min=1, max=10_000, metavar="N", help="Also show the DAG unrolled over N iterations.")] = None,
        capacity: Annotated[str, typer.Option(
            "--capacity", metavar="auto|cluster|spec", help="Check resources against: auto (sinfo if a cluster answers, else the spec), "
                               "cluster, or spec.")] = "auto",
        runs_dir: Annotated[Optional[Path], typer.Option(
            "--runs-dir", metavar="DIR", help="Runs root shown in the script (default $HETRUN_RUNS, else ./runs).")] = None,
        fit: Annotated[bool, typer.Option(
            "--fit", help="Place every component as `hetrun submit --fit` would (placement: auto components "
                          "are always placed when a Slurm controller answers).")] = False,
    ) -> None:
        """Show the action DAG, priorities, het components and the exact sbatch script of a job."""
        from hetrun.dag.plan import build_plan_explained

        from hetrun.errors import SpecError

        if capacity not in ("auto", "cluster", "spec"):
            raise SpecError(f"--capacity {capacity!r}: expected auto, cluster or spec")
        spec = load_job(job, overrides_from(partition, time_limit, account, qos, nodes, gres, constraint, sets))
        if spec.checkpoint.object_store is not None:  # reachable, bucket there, writable: before any queue
            from hetrun.runtime.ckpt.object_preflight import preflight

            preflight(spec.checkpoint.object_store, str(job))
        from hetrun.slurm_plugin.backends import choose_auto

        # At most once, when asked: the capacities, the placement and --explain all want it.
        probe = functools.cache(choose_auto)
        caps, cap_source = _capacities(spec, capacity, job, probe)
        build = build_plan_explained(spec, capacities=caps)
        placed, unplaced = _placed_plan(build, spec, fit, probe)
        if as_json:  # plan.json as submit writes it (the placement choices in it)
            for note in unplaced:
                sys.stderr.write(f"hetrun: {note}\n")
            sys.stdout.write(placed.to_json())
            return
        from rich.console import Console

        # Piped output gets a wide fixed width so ids and deps are not cut to fit 80 columns.
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        _print_plan(console, build, spec, cap_source)
        if build.plan.training is not None:  # a job of command components has no action DAG to show
            _print_scale(console, build)
            if explain:
                _print_explain(console, build)
            if unroll_n:
                _print_unroll(console, build, unroll_n)
        if explain:
            from hetrun.slurm_plugin.placement_fit import explain as explain_fit
            from hetrun.slurm_plugin.placement_fit import explain_lines

            console.print("[bold]placement[/bold]")
            for line in explain_lines(explain_fit(spec, probe=probe())):
                console.print(line, markup=False)
        from hetrun.cli.submit_cmd import placement_lines

        for line in placement_lines(placed) + [f"note: {n}" for n in unplaced]:
            console.print(line, markup=False)
        script, note = _render_script(placed, spec, runs_dir)
        console.print(f"[bold]sbatch script[/bold] ({note})")
        console.file.flush()
        # Written raw: the script must come out byte for byte, never re-wrapped by rich.
        sys.stdout.write(script if script.endswith("\n") else script + "\n")

    @app.command("schema")
    def schema_cmd() -> None:
        """Print the JSON Schema of the job YAML (for editor completion)."""
        from hetrun.dag.spec import job_json_schema

        sys.stdout.write(json.dumps(job_json_schema(), indent=2) + "\n")

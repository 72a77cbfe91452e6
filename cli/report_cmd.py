"""`hetrun report RUN`: what ran where, busy time, throughput, checkpoints, cost.

Reads only the run directory (hetrun.reports.run_report imports neither torch nor
mpi4py); rich is imported inside the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}"


def _resolve(ref: str, runs_dir: Path | None) -> Path:
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    from hetrun.slurm_plugin.rundir import find_run, runs_root

    return Path(find_run(ref, runs_root(runs_dir)).run_dir)


def _restored_text(comps: dict) -> str:
    """Per component what really came back: a step only where every rank restored it."""
    out = []
    for name, c in comps.items():
        if c["state"] == "restored":
            out.append(f"{name}@{c['step']}")
        elif c["state"] == "fresh":
            out.append(f"{name} FRESH")
        else:
            out.append(f"{name} ?")
    return " ".join(out) or "-"


def _print_checkpoint_summary(console, rep) -> None:
    """One line per component: written, kept, the newest (step, time, size), failures, restores."""
    import time

    summary = (rep.checkpoint_history or {}).get("summary") or {}
    for name, s in summary.items():
        when = time.strftime("%H:%M:%S UTC", time.gmtime(s["newest_created"])) if s.get("newest_created") else "-"
        size = f", state {_bytes(s['newest_state_bytes'])}" if s.get("newest_state_bytes") is not None else ""
        parts = [f"{s['count']} written", f"{s['in_store']} in the store ({_bytes(s['stored_bytes'])})",
                 f"newest step {s['newest_step']} at {when}{size}"]
        if s.get("failed"):
            parts.append(f"{s['failed']} failed")
        if s.get("restored"):
            parts.append(f"{s['restored']} restored by a restart")
        console.print(f"checkpoints {name}: " + "; ".join(parts), markup=False, highlight=False)
    if not summary:
        for note in (rep.checkpoint_history or {}).get("notes") or ["none written"]:
            console.print(f"checkpoints: {note}", markup=False, highlight=False)


def _print_memory_tier(console, rep) -> None:
    """The memory tier's line (a job with spare_nodes, min_nodes or checkpoint.memory_every): its N,
    its cost on the training thread, and whether memory_every_max held N below the 2 % budget's."""
    from hetrun.reports.node_failures import memory_tier_summary

    line = memory_tier_summary(rep.run_dir)
    if line:
        console.print(line, markup=False, highlight=False)


def _print_checkpoints(console, rep) -> None:
    """Every checkpoint: step, bytes, ratio to the full state, stall, save time, tier, verified."""
    import time

    from rich.table import Table

    hist = rep.checkpoint_history or {}
    rows = hist.get("rows") or []
    if rows:
        t = Table(show_edge=False, pad_edge=False, title="checkpoints")
        for col in ("COMPONENT", "STEP", "CREATED (UTC)", "REASON", "STATE", "ADDED", "RATIO", "STALL",
                    "SAVE", "TIERS", "VERIFIED"):
            t.add_column(col)
        for r in rows:
            created = time.strftime("%H:%M:%S", time.gmtime(r["created"])) if r.get("created") else "-"
            opt = (lambda v, f: "-" if v is None else f(v))  # noqa: E731
            t.add_row(r["component"], str(r["step"]), created, str(r.get("reason") or "-"),
                      opt(r["state_bytes"], _bytes), opt(r["stored_bytes"], _bytes),
                      opt(r["ratio"], lambda v: f"{v:.3f}"), opt(r["stall_s"], lambda v: f"{v:.3f}s"),
                      opt(r["save_s"], lambda v: f"{v:.2f}s"), ",".join(r["tiers"]) or "-",
                      r["verified"] if not r.get("error") else f"{r['verified']} ({r['error']})")
        console.print(t)
    for note in hist.get("notes") or []:
        console.print(f"note: {note}", markup=False, highlight=False)


def _print_resources(console, rep) -> None:
    """CPU, memory and GPU per component and node, from the runtime's sampler."""
    from rich.table import Table

    res = rep.resources or {}
    if res.get("rows"):
        t = Table(show_edge=False, pad_edge=False, title="resources (sampled)")
        for col in ("COMPONENT", "NODE", "SAMPLES", "CPU%", "RSS MAX", "GPU%", "GPU MEM MAX", "GPU W"):
            t.add_column(col)
        for r in res["rows"]:
            opt = (lambda v, f: "-" if v is None else f(v))  # noqa: E731
            t.add_row(r["component"], r["node"], str(r["samples"]), opt(r["cpu_pct"], lambda v: f"{v:.0f}"),
                      opt(r["rss_max"], _bytes), opt(r["gpu_util"], lambda v: f"{v:.0f}"),
                      opt(r["gpu_mem_max"], _bytes), opt(r["gpu_power_w"], lambda v: f"{v:.0f}"))
        console.print(t)
    if res.get("note"):
        console.print(f"note: {res['note']}", markup=False, highlight=False)


def _amount(v: float) -> str:
    """Four decimals; a non-zero amount below 0.0001 with three significant digits instead
    (the demo run's 0.00003 USD/iteration printed as 0.0000 said nothing)."""
    import math

    if v == 0 or not math.isfinite(v) or abs(v) >= 1e-4:
        return f"{v:.4f}"
    return f"{v:.{2 - math.floor(math.log10(abs(v)))}f}"


def _print_cost(console, rep) -> None:
    c = rep.cost
    if not c:
        return
    cur = c["currency"]
    per = []
    if c.get("per_iteration") is not None:
        per.append(f"{_amount(c['per_iteration'])} {cur}/{_unit(rep)}")
    if c.get("per_million_env_steps") is not None:
        per.append(f"{_amount(c['per_million_env_steps'])} {cur}/M env steps")
    comps = ", ".join(f"{name} {_amount(row['cost'])}" for name, row in c["components"].items())
    console.print(f"cost {_amount(c['total'])} {cur} ({comps}; from {c['source']})"
                  + (f"  {'  '.join(per)}" if per else "")
                  + f"  {_amount(rep.node_hours)} node-h, {_amount(rep.core_hours)} core-h, "
                    f"{_amount(rep.gpu_hours)} GPU-h",
                  markup=False, highlight=False)


def _wasted_text(rep) -> str | None:
    """The share of the allocation wasted, and what it is made of; idle time only where the
    ranks say when they work (a command that logs no steps is named, not called idle)."""
    c = rep.cost
    if not c:
        return None
    blind = c.get("idle_unmeasured") or []
    idle = f"idle inside the allocation {100 * c['wasted_idle_share']:.1f}%"
    if blind and len(blind) == len(rep.components):
        return (f"wasted {100 * c['wasted_restarts_share']:.1f}% (work lost to restarts; idle time not "
                f"measured: {', '.join(blind)} log no steps)")
    if blind:
        idle += f" of the components that log their work ({', '.join(blind)} log none)"
    return f"wasted {100 * c['wasted_share']:.1f}% (work lost to restarts {100 * c['wasted_restarts_share']:.1f}%, {idle})"


def _print_accounting(console, rep) -> None:
    """Slurm's own record per component and attempt (sacct), or the one line saying why not."""
    from rich.table import Table

    acc = rep.accounting or {}
    if acc.get("note"):
        if acc["note"] != "not asked":
            console.print(f"slurm accounting: {acc['note']}", markup=False, highlight=False)
        return
    t = Table(show_edge=False, pad_edge=False, title="slurm accounting (sacct)")
    for col in ("COMPONENT", "JOBID", "ATTEMPT", "STATE", "ELAPSED", "ALLOCTRES", "MAXRSS", "EXIT", "NODES"):
        t.add_column(col)
    for r in acc.get("rows") or []:
        t.add_row(r["component"], r["job_id"], str(r["attempt"] + 1), r["state"],
                  "-" if r["elapsed_s"] is None else _dur(r["elapsed_s"]), r["alloc_tres"],
                  "-" if r["max_rss"] is None else _bytes(r["max_rss"]), r["exit_code"], r["nodes"])
    console.print(t)


def _unit(rep) -> str:
    """The job's own unit of work: a command job (every component a program) counts the
    steps it logs through the run API, an action job its iterations."""
    return "step" if rep.components and all(c.command for c in rep.components) else "iteration"


def _lost_text(rep) -> str:
    """Work lost over all restarts, in the job's own unit (a command job's steps)."""
    unit = f"{_unit(rep)}(s)"
    secs = sum(r["work_lost_s"] or 0 for r in rep.restart_history)
    if rep.work_lost is None:
        return "work lost not recorded (no restore line says it)"
    return f"work lost {rep.work_lost} {unit}" + (f", {_dur(secs)}" if secs else "")


def _print_restarts(console, rep, details: bool = False) -> None:
    """Restart history: each restart's cause, queue wait, what came back, work lost;
    ``details``: each restore's timing too."""
    from rich.table import Table

    if not rep.restart_history:
        return
    t = Table(show_edge=False, pad_edge=False, title="restarts")
    lost = "LOST STEPS" if _unit(rep) == "step" else "LOST ITERS"
    for col in ("RESTART", "CAUSE", "QUEUE WAIT", "TO 1ST STEP", "RESTORED", lost, "LOST TIME"):
        t.add_column(col)
    for r in rep.restart_history:
        opt = (lambda v: "-" if v is None else _dur(v))  # noqa: E731
        t.add_row(str(r["restart"]), r["cause_text"], opt(r["queue_wait_s"]), opt(r["first_step_s"]),
                  _restored_text(r["components"]),
                  "-" if r["work_lost_iterations"] is None else str(r["work_lost_iterations"]),
                  opt(r["work_lost_s"]))
    console.print(t)
    for r in rep.restart_history:
        for line in r["detail"]:
            console.print(f"  restart {r['restart']}: previous attempt: {line}", markup=False, highlight=False)
        before, after = r.get("sizes_before") or {}, r.get("sizes") or {}
        resized = [f"{c} {before[c]} -> {after[c]}" for c in after if before.get(c) not in (None, after[c])]
        if resized:
            console.print(f"  restart {r['restart']}: resized: {', '.join(resized)} ranks",
                          markup=False, highlight=False)
        for name, comp in r["components"].items():
            if comp["state"] != "restored":
                what = "started fresh" if comp["state"] == "fresh" else comp["state"]
                console.print(f"  restart {r['restart']}: {name}: {what} ({comp['fresh_reason']}); "
                              f"{comp['ranks_restored']}/{comp['ranks']} rank(s) restored their state",
                              markup=False, highlight=False)
        if r.get("work_lost_from_actions") not in (None, r["work_lost_iterations"]):
            console.print(f"  restart {r['restart']}: note: the restore lines say {r['work_lost_iterations']} "
                          f"iteration(s) lost, the action lines {r['work_lost_from_actions']}",
                          markup=False, highlight=False)
    from hetrun.reports.node_failures import node_failure_lines

    for line in node_failure_lines(rep.run_dir):  # in-allocation restarts (spare_nodes)
        console.print(f"  node failure: {line}", markup=False, highlight=False)
    for row in rep.resumes if details else ():
        secs_text = "" if row.get("seconds") is None else f" in {row['seconds']:.2f}s"
        if row.get("start_to_restored_s") is not None:
            # from the attempt's batch script start (ranks up, then restored)
            secs_text += (f" ({row['start_to_restored_s']:.2f}s after the job started, ranks up in "
                          f"{row.get('startup_s', 0.0):.2f}s)")
        skipped = "".join(f"; skipped checkpoint {s['step']}: {s['why']}" for s in row["skipped"])
        console.print(f"  restart {row['restart']}: {row['ranks']} rank(s) ran restore, checkpoint step "
                      f"{row['step']}{secs_text}{skipped}", markup=False, highlight=False)


def _print_headline(console, rep) -> None:
    """What the report leads with: did it work, the result, how fast, what was wasted; then
    the attempts with the one count of restarts / preemptions `hetrun status` shows."""
    from rich.markup import escape

    h = rep.headline or {}
    head = f"run {rep.name}" + (f"  job {rep.job_id}" if rep.job_id else "") + \
        (f"  backend {rep.backend}" if rep.backend else "")
    console.print(head, markup=False, highlight=False)
    word = h.get("status") or "not started"
    where = f" (attempt {h['attempt'] + 1})" if h.get("attempt") else ""
    style = "red" if word == "failed" else "green" if word == "done" else "yellow"
    failure = f": {escape(h['failure'])}" if h.get("failure") else ""
    console.print(f"[{style}]{escape(word)}[/{style}]{where}{failure}", markup=True, highlight=False)
    for more in (rep.outcome.get("failures") or [])[1:]:
        console.print(f"  also: {more}", markup=False, highlight=False)
    res = h.get("result")
    if res:
        at = f" at {'step' if res['kind'] == 'step' else 'iteration'} {res['iteration']}" \
            if res.get("iteration") is not None else ""
        source = "" if res["kind"] == "step" else f" ({res['kind']})"
        console.print(f"result: {res['name']} {res['value']:.4g}{at}{source}", markup=False, highlight=False)
    else:
        console.print("result: none logged (no return or loss in the metrics)", markup=False, highlight=False)
    if h.get("throughput"):
        console.print(f"throughput: {h['throughput']}", markup=False, highlight=False)
    wasted = _wasted_text(rep)
    if wasted:
        console.print(wasted, markup=False, highlight=False)
    c = rep.counts
    restarts = f"  restarts {h.get('restarts', 0)}"
    if h.get("restarts"):
        why = [f"{n} {label}" for key, label in (("preemptions", "preempted"), ("time_limits", "time limit"),
                                                  ("failures", "failed"), ("unknown", "unknown"))
               if (n := c.get(key, 0))]
        for cause, label in (("done", "resumed after it finished"), ("cancelled", "resumed after a cancel")):
            if (n := sum(r["cause"] == cause for r in rep.restart_history)):
                why.append(f"{n} {label}")
        restarts += f" ({', '.join(why)}); {_lost_text(rep)}" if why else f"; {_lost_text(rep)}"
    console.print(f"wall {_dur(rep.wall_s)}  attempts {rep.attempts}{restarts}", markup=False, highlight=False)
    work = []
    if any(not x.command for x in rep.components):
        work.append(f"actions {rep.actions} ({rep.actions_per_s:.1f}/s)")
        if rep.env_steps:
            work.append(f"env steps {rep.env_steps}")
        if rep.samples:
            work.append(f"samples {rep.samples}")
    for name, n in (h.get("command_steps") or {}).items():
        last = rep.metrics.get("step") or {}
        logged = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in last.items() if k != "iteration")
        tail = f" (last step {last.get('iteration')}: {logged})" if logged else ""
        work.append(f"{name} {n} steps logged{tail}" if n else f"{name}: no steps logged (the program does "
                    "not call run.log)")
    if work:
        console.print("work: " + "  ".join(work), markup=False, highlight=False)


def _print_throughput(console, rep) -> None:
    # reports/throughput.py: the one definition (steady per attempt, whole run with its gaps)
    from hetrun.reports.throughput import throughput_lines

    for line in throughput_lines(rep.throughput):
        console.print(line, markup=False, highlight=False)


def _print_components(console, rep, details: bool = False) -> None:
    """The components table (a command component counts its logged steps), how long
    components overlapped; ``details``: when each was active."""
    from rich.table import Table

    t = Table(title="components", show_edge=False, pad_edge=False)
    for col in ("COMPONENT", "RANKS", "NODES", "ITERS/STEPS", "ACTIONS", "S/ITER", "BUSY", "BUSY%", "MOVED",
                "NODE-H", "CORE-H", "GPU-H"):
        t.add_column(col)
    for c in rep.components:
        unmeasured = c.command and not c.actions  # a program that logs no steps: its busy time is not known
        t.add_row(c.name, str(c.ranks), ",".join(c.nodes), str(c.iterations),
                  "-" if c.command else str(c.actions), f"{c.s_per_iteration:.3f}" if c.iterations else "-",
                  "-" if unmeasured else _dur(c.busy_s), "-" if unmeasured else f"{100 * c.busy_fraction:.0f}%",
                  _bytes(c.bytes), f"{c.node_hours:.4f}", f"{c.core_hours:.4f}", f"{c.gpu_hours:.4f}")
    console.print(t)
    for pair, secs in rep.overlap_s.items():
        console.print(f"components running at the same time ({pair}): {_dur(secs)}")
    if not details:
        return
    tl = Table(title="timeline (seconds from the first event)", show_edge=False,
               pad_edge=False)
    for col in ("COMPONENT", "FIRST ACTION", "LAST ACTION", "ACTIVE", "S/ITER"):
        tl.add_column(col)
    for c in rep.components:
        tl.add_row(c.name, f"{c.first_action or 0:.2f}", f"{c.last_action or 0:.2f}",
                   _dur(c.active_s), f"{c.s_per_iteration:.3f}")
    console.print(tl)


def _print_gantt(console, rep) -> None:
    from hetrun.reports.timeline_view import timeline_rows

    labels = {r.rank: f"{r.rank} {r.component}" for r in rep.ranks}
    for line in timeline_rows(rep.timeline, labels, console.width):
        console.print(line, no_wrap=True, overflow="crop")


def _print_ranks(console, rep) -> None:
    from rich.table import Table

    r = Table(title="ranks", show_edge=False, pad_edge=False)
    for col in ("RANK", "COMPONENT", "NODE", "ACTIONS", "BY TYPE", "BUSY", "BUSY%",
                "MOVED", "PEAK MEM"):
        r.add_column(col)
    for row in rep.ranks:
        types = " ".join(f"{k}:{v}" for k, v in sorted(row.by_type.items()))
        r.add_row(str(row.rank), row.component, row.node, str(row.actions), types,
                  _dur(row.busy_s), f"{100 * row.busy_fraction:.0f}%", _bytes(row.bytes),
                  _bytes(row.peak_mem))
    console.print(r)


def _print_metrics(console, rep) -> None:
    """The last metrics of each action type, and the event counts with the allocation's hours."""
    for kind, m in rep.metrics.items():
        vals = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in m.items())
        console.print(f"last {kind}: {vals}")


def _print_placement(console, rep) -> None:
    from hetrun.reports.placement import placement_lines

    for line in placement_lines(rep.placement):
        console.print(line, markup=False, highlight=False)


def _print_demand(console, rep) -> None:
    from hetrun.reports.demand_section import demand_lines

    for line in demand_lines(rep.demand):
        console.print(line, markup=False, highlight=False)


def _write_exports(rep, html: Path | None, png: Path | None) -> None:
    """--html FILE and --png DIR: the same page; the PNGs are its plots drawn by chromium."""
    from hetrun.reports.html import render_html

    page = render_html(rep)
    if html is not None:
        html.write_text(page)
    if png is not None:
        from hetrun.reports.png import write_pngs

        files = write_pngs(page, png)
        typer.echo(f"wrote {len(files)} PNG(s) to {png}: {', '.join(f.name for f in files)}", err=True)


def _print_vs(a, b, as_json: bool) -> None:
    from hetrun.reports.compare import compare

    rows = compare(a, b)
    if as_json:
        typer.echo(json.dumps({"a": a.run_dir, "b": b.run_dir, "rows": rows}, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    def fmt(v) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    t = Table(show_edge=False, pad_edge=False, title=f"A = {a.name} ({a.run_dir})\nB = {b.name} ({b.run_dir})")
    for col in ("METRIC", "UNIT", "A", "B", "B/A"):
        t.add_column(col, justify="left" if col in ("METRIC", "UNIT") else "right")
    for r in rows:
        t.add_row(r["metric"], r["unit"], fmt(r["a"]), fmt(r["b"]),
                  "-" if r["ratio"] is None else f"{r['ratio']:.2f}x")
    Console(width=200 if not Console().is_terminal else None).print(t)


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        run: Annotated[Optional[str], typer.Argument(
            help="Run: directory, name (prefix) or Slurm job id.", show_default=False)] = None,
        runs_dir: Annotated[Optional[Path], typer.Option(
            "--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
            help="Where run directories live (default ./runs).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
        per_rank: Annotated[bool, typer.Option(
            "--ranks/--no-ranks", help="Also show the per-rank table.")] = False,
        demand: Annotated[bool, typer.Option(
            "--demand", help="Also show tune's demand model against what each window measured.")] = False,
        ckpt_rows: Annotated[bool, typer.Option(
            "--checkpoints", help="Also show one row per checkpoint (the default: one line per component).")] = False,
        show_all: Annotated[bool, typer.Option(
            "--all", help="Show every section: per rank, per checkpoint, demand, metrics, resources, "
                          "throughput per attempt, Slurm accounting, each restore.")] = False,
        vs: Annotated[Optional[str], typer.Option(
            "--vs", help="Compare with this run (B): the two side by side with B/A.")] = None,
        gantt: Annotated[bool, typer.Option(
            "--timeline/--no-timeline", help="Show the per-rank timeline (one row per rank).")] = True,
        verify: Annotated[bool, typer.Option(
            "--verify-checkpoints", help="Decode and check every checkpoint (slow on large states).")] = False,
        html: Annotated[Optional[Path], typer.Option(
            "--html", help="Also write one self-contained HTML file (inline SVG plots, no scripts).")] = None,
        png: Annotated[Optional[Path], typer.Option(
            "--png", help="Also write each plot of --html as DIR/<plot>.png (needs chromium).")] = None,
        schema: Annotated[bool, typer.Option(
            "--schema", help="Print the JSON Schema of --json and exit.")] = False,
        prices: Annotated[Optional[Path], typer.Option(
            "--prices", envvar="HETRUN_PRICES", show_envvar=True,
            help="Price table YAML (currency, node_hour, core_hour, gpu_hour, partitions). "
                 "Default: ~/.config/hetrun/prices.yaml, else 0.05/core-hour and 2.50/GPU-hour.")] = None,
    ) -> None:
        """What ran where: per component, rank and node; throughput; restarts; checkpoints; cost."""
        # Over 60 lines only by its signature (the options Typer reads); the body delegates.
        if schema:
            from hetrun.reports.schema import REPORT_SCHEMA

            typer.echo(json.dumps(REPORT_SCHEMA, indent=2))
            return
        if run is None:
            from hetrun.errors import RunDirError

            raise RunDirError("hetrun report needs a RUN", hint="give a run directory, run name or Slurm job id")
        from hetrun.reports.cost import load_prices, prices_path
        from hetrun.reports.run_report import build_report

        table = load_prices(prices_path(prices))
        rep = build_report(_resolve(run, runs_dir), verify_checkpoints=verify, prices=table)
        if html is not None or png is not None:
            _write_exports(rep, html, png)
        if vs is not None:
            _print_vs(rep, build_report(_resolve(vs, runs_dir), verify_checkpoints=verify, prices=table), as_json)
            return
        if as_json:
            typer.echo(json.dumps(rep.to_dict(), indent=2, default=str))
            return

        from rich.console import Console

        console = Console(width=200 if not Console().is_terminal else None)
        _print_report(console, rep, ranks=per_rank or show_all, timeline=gantt, demand=demand or show_all,
                      checkpoints=ckpt_rows or show_all, details=show_all)


def _print_report(console, rep, *, ranks: bool, timeline: bool, demand: bool, checkpoints: bool,
                  details: bool) -> None:
    """The outcome first (did it work, the result, how fast, what was wasted), then where the
    time went; the long sections only when asked (docs/CONTRACTS.md, Reports)."""
    _print_headline(console, rep)
    if details:
        _print_throughput(console, rep)
    _print_placement(console, rep)
    _print_components(console, rep, details)
    if timeline:
        _print_gantt(console, rep)
    if ranks and rep.ranks:
        _print_ranks(console, rep)
    _print_restarts(console, rep, details)
    _print_checkpoint_summary(console, rep)
    _print_memory_tier(console, rep)
    if checkpoints:
        _print_checkpoints(console, rep)
    _print_cost(console, rep)
    if details:
        _print_metrics(console, rep)
        _print_resources(console, rep)
        _print_accounting(console, rep)
    elif (rep.accounting or {}).get("note") not in (None, "not asked"):
        console.print(f"slurm accounting: {rep.accounting['note']}", markup=False, highlight=False)
    if demand:
        _print_demand(console, rep)
    for w in rep.warnings:
        console.print(f"note: {w}", highlight=False)
    if rep.skipped_lines:
        console.print(f"note: skipped {rep.skipped_lines} truncated/corrupt event line(s)")
    if not details:
        console.print("more: --ranks, --checkpoints (one row each), --demand, --all (every section)",
                      markup=False, highlight=False)

"""The body of `hetrun status`, without Typer: the console script's fast path calls it
directly for the plain forms (``fast_args``), the Typer command (cli/status_cmd.py) for the rest.

One squeue call answers for every Slurm run (sacct once more for runs that
have left squeue); a run whose job has ended is answered from its run directory's
status cache (cli/status_cache.py) without either, once a status has seen it end.
Imports neither torch, mpi4py, Typer, pydantic nor rich (the table is plain
columns; --watch draws with rich).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def _echo(text: str) -> None:
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def _elapsed(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def _restarts_text(from_events: int, from_scheduler: int) -> str:
    """Restarts the runtime saw; the scheduler's count beside it only when it is higher
    (an attempt requeued before any rank started leaves no event)."""
    if from_scheduler > from_events:
        return f"{from_events} (scheduler: {from_scheduler})"
    return str(from_events)


def _reason(comp, failure: list | None, first: bool, names: list[str]) -> str:  # type: ignore[no-untyped-def]
    """On an ended component, why the newest attempt failed (``failure``: [the failing rank's
    component, the text: the rank and its own error line, from the post-mortem; the
    scheduler's NonZeroExitCode says less]), never a bare FAILED: on the failing component's
    row, or on the first row when no component is named. Otherwise the scheduler's reason."""
    from hetrun.slurm_plugin.backends.base import ACTIVE_STATES

    if failure is None or comp.state in ACTIVE_STATES:
        return comp.reason or ""
    component, text = failure
    mine = component == comp.name or (first and component not in names)
    return text if mine else comp.reason or ""


def fast_args(argv: list[str]) -> dict | None:
    """``hetrun status`` arguments parsed without Typer (whose parameter coercion imports
    pydantic and builds every command: over a second of a status that should answer in
    squeue's time), for the plain forms: RUN..., --runs-dir DIR, -n/--last N, --json. None for
    anything else (--watch, --help, a bad value...): Typer parses those, with its messages."""
    out: dict = {"runs": [], "runs_dir": None, "last": 20, "as_json": False}
    i = 0
    while i < len(argv):
        word = argv[i]
        key, eq, value = word.partition("=")
        if word == "--json":
            out["as_json"] = True
        elif key in ("--runs-dir", "--last", "-n") and (eq or i + 1 < len(argv)):
            if not eq:
                i += 1
                value = argv[i]
            if key == "--runs-dir":
                out["runs_dir"] = Path(value)
            elif value.lstrip("-").isdigit():
                out["last"] = int(value)
            else:
                return None
        elif word.startswith("-") or not word:
            return None
        else:
            out["runs"].append(word)
        i += 1
    return out


def show_status(runs: list[str] | None, runs_dir: Path | None, last: int, as_json: bool, *,
                watch: bool = False, interval: float = 2.0) -> None:
    """The body of `hetrun status` (its Typer command and ``fast_args``' path both call it)."""
    from hetrun.slurm_plugin.rundir import find_run, list_runs, runs_root

    root = runs_root(runs_dir)
    chosen = [find_run(ref, root) for ref in runs] if runs else list_runs(root)
    if not runs and last > 0:
        chosen = chosen[-last:]
    if not chosen:
        _echo("[]" if as_json else f"no runs under {root}")
        return
    failures: list = []

    if watch:
        from hetrun.cli.status_watch import watch as live_watch

        live_watch(chosen, lambda runs: _query(runs, failures), interval, sys.stdout.isatty(), _echo)
        return
    from hetrun.cli import status_cache

    keys = {run.run_dir: status_cache.fingerprint(run.run_dir) for run in chosen}
    cached = _from_cache(chosen, keys)
    todo = [run for run in chosen if run.run_dir not in cached]
    if as_json:
        import json

        _echo(json.dumps(_json_doc(chosen, _query(chosen, failures, cached)), indent=2, default=str))
    else:
        import threading

        # The scheduler's answer (squeue, then sacct for jobs that left it: ~0.1 s, nearly
        # all of it waiting) comes in on a thread while this one reads the run directories
        # and imports the table's modules. Runs answered by their cache ask nothing.
        got: dict = {}

        def ask() -> None:
            try:
                got["results"] = _query(todo, failures)
            except BaseException as exc:  # raised again on this thread below
                got["error"] = exc

        asking = threading.Thread(target=ask, daemon=True)
        if todo:
            asking.start()
        local = {run.run_dir: _local_summary(run.run_dir) for run in todo}
        if todo:
            asking.join()
        if "error" in got:
            raise got["error"]
        results = {**{run_dir: st for run_dir, (st, _) in cached.items()}, **got.get("results", {})}
        local.update({run_dir: summary for run_dir, (_, summary) in cached.items()})
        _keep_final(todo, results, local, keys)
        _print_table(chosen, results, local)
    if failures:
        raise failures[-1]


_SUMMARY_KEYS = frozenset({"placements", "restarts", "preemptions", "failures", "work_lost", "failure",
                           "node_failures"})  # what _local_summary returns


def _summary_ok(summary: dict) -> bool:
    """A cached ``_local_summary`` of the shape the table reads (else the run is read afresh)."""
    failure = summary.get("failure")
    return (set(summary) == _SUMMARY_KEYS and isinstance(summary["placements"], dict)
            and isinstance(summary["node_failures"], list)
            and all(isinstance(summary[k], int) for k in ("restarts", "preemptions", "failures"))
            and (failure is None or (isinstance(failure, list) and len(failure) == 2)))


def _from_cache(runs: list, keys: dict) -> dict:
    """Run directory -> (RunStatus: sacct's final answer as it was, the table's figures) for
    the runs whose status cache matches ``keys`` (cli/status_cache.py)."""
    from hetrun.cli import status_cache

    records = {run.run_dir: rec for run in runs if (rec := status_cache.read(run.run_dir, keys[run.run_dir]))
               and _summary_ok(rec["local"])}
    if not records:
        return {}
    from hetrun.slurm_plugin.backends.base import ComponentStatus, RunStatus

    out = {}
    for run in runs:
        if run.run_dir in records:
            try:
                comps = [ComponentStatus(**c) for c in records[run.run_dir]["components"]]
            except TypeError:  # a record of another shape: read the run afresh
                continue
            out[run.run_dir] = (RunStatus(run, comps, "status-cache"), records[run.run_dir]["local"])
    return out


def _keep_final(runs: list, results: dict, local: dict, keys: dict) -> None:
    """Cache the answer of each run the scheduler has seen end (cli/status_cache.py)."""
    from dataclasses import asdict

    from hetrun.cli import status_cache
    from hetrun.slurm_plugin.backends.base import ACTIVE_STATES

    for run in runs:
        st = results[run.run_dir]
        if status_cache.is_final(st.components, run.components, st.source, ACTIVE_STATES):
            status_cache.write(run.run_dir, keys[run.run_dir], [asdict(c) for c in st.components], local[run.run_dir])


def _query(runs: list, failures: list, cached: dict | None = None) -> dict:
    """One status call per backend for all its runs (one squeue for every Slurm run); the
    runs in ``cached`` (their status cache matched) are answered from it, asking nothing."""
    results = {run.run_dir: cached[run.run_dir][0] for run in runs if run.run_dir in (cached or {})}
    runs = [run for run in runs if run.run_dir not in results]
    if not runs:
        return results
    from hetrun.slurm_plugin.backends import get_backend, resolve_name
    from hetrun.slurm_plugin.backends.base import ComponentStatus, RunStatus

    from hetrun.errors import HetrunError

    by_backend: dict[str, list] = {}
    for run in runs:
        by_backend.setdefault(resolve_name(run.backend), []).append(run)
    for name, group in by_backend.items():
        try:
            results.update(get_backend(name).status(group))
        except HetrunError as exc:
            # One unreachable backend must not hide the runs of the others.
            failures.append(exc)
            reason = str(exc).splitlines()[0][:80]
            for run in group:
                results[run.run_dir] = RunStatus(
                    run, [ComponentStatus(c, "ERROR", reason=reason) for c in run.components], name)
    return results


def _never_placed(run_dir: str) -> bool:
    """No component of the run was ever placed by hetrun: its job.yaml names no placement, its
    plan.json records no choice and no resume replaced the plan (then every cell would read
    "fixed (from the YAML)": the table skips the YAML parse, the slow part of a status)."""
    from hetrun.reports.placement import archived_plans
    from hetrun.slurm_plugin.rundir import JOB_YAML, PLAN_JSON

    try:
        job = (Path(run_dir) / JOB_YAML).read_bytes()
        plan = (Path(run_dir) / PLAN_JSON).read_bytes()
    except OSError:
        return False
    return b"placement" not in job and b'"placement"' not in plan and not archived_plans(Path(run_dir))


def _placement_section(run_dir: str) -> dict | None:
    """The report's placement section (reports/placement.py) without sacct; None: no plan.json."""
    from hetrun.reports.placement import placement_section
    from hetrun.runtime.plan_view import load_plan

    from hetrun.errors import RunDirError

    try:
        plan = load_plan(run_dir, validate=False).raw
    except RunDirError:
        return None
    return placement_section(Path(run_dir), plan)


def _placements(section: dict | None) -> dict[str, str]:
    """Component -> where it is placed (and where it was before a resume moved it), from a run's
    placement section; the details (score, start estimate, the candidates that lost) are in `hetrun report`."""
    from hetrun.reports.placement import newest_by_component

    return newest_by_component(section) if section else {}


def _json_doc(chosen: list, results: dict) -> list[dict]:
    """`hetrun status --json`: a record per run; each component with the scheduler's view and its
    newest placement (a row of `hetrun report --json`'s placement section, or null)."""
    from dataclasses import asdict

    from hetrun.reports.attempts import counts_dict, status_details

    out = []
    for run in chosen:
        st = results[run.run_dir]
        counts, lost, failed = status_details(run.run_dir)
        section = _placement_section(run.run_dir)
        rows = {r["component"]: r for r in section["attempts"][-1]["components"]} if section else {}
        cells = _placements(section)
        out.append({"run": Path(run.run_dir).name, "run_dir": run.run_dir, "backend": run.backend,
                    "job_id": run.job_id, "state": st.state, "counts": counts_dict(counts), "work_lost": lost,
                    "failure": failed.text if failed else None,
                    "components": [{**asdict(c), "placement": rows.get(c.name), "placement_text": cells.get(c.name)}
                                   for c in st.components]})
    return out


def _local_summary(run_dir: str) -> dict:
    """What the table shows of a run from its directory alone, as plain JSON values (what
    the status cache keeps): placements; attempt counts, work lost and the newest failure
    (the functions `hetrun report` calls, so the two agree); node failures recovered."""
    from hetrun.reports.attempts import status_details
    from hetrun.reports.node_failures import node_failure_lines

    counts, lost, failed = status_details(run_dir)
    return {"placements": {} if _never_placed(run_dir) else _placements(_placement_section(run_dir)),
            "restarts": counts.restarts, "preemptions": counts.preemptions, "failures": counts.failures,
            "work_lost": lost, "failure": [failed.component, failed.text] if failed else None,
            "node_failures": node_failure_lines(run_dir)}


def _table_text(header: list[str], rows: list[list[str]], width: int | None) -> str:
    """The status table as plain columns, drawn like the rich tables of `hetrun report`
    (header cells split by ┃, a ━/╇ rule, row cells by │). Written out by hand: rich's
    Table measured and wrapped every cell, 0.19 s of a 0.5 s status with 20 runs (most of
    the 0.3 s issue 24 allows). ``width`` (a terminal's) cuts the last column to fit with
    an ellipsis; otherwise nothing is cut (as squeue's own lines)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    if width is not None:
        room = width - sum(w + 3 for w in widths[:-1])
        widths[-1] = max(min(widths[-1], room), len(header[-1]))

    def line(cells: list[str], sep: str) -> str:
        out = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            if len(cell) > w:
                cell = cell[: max(w - 1, 0)] + "…"
            out.append(cell.ljust(w) if i < len(cells) - 1 else cell)
        return f" {sep} ".join(out).rstrip()

    rule = "╇".join("━" * (w + (1 if i in (0, len(widths) - 1) else 2)) for i, w in enumerate(widths))
    return "\n".join([line(header, "┃"), rule, *(line(r, "│") for r in rows)])


def _print_table(chosen: list, results: dict, local: dict) -> None:
    from hetrun.reports.placement import FIXED_TEXT

    placed = {run_dir: summary["placements"] for run_dir, summary in local.items()}
    # The column only where some component was placed by hetrun: "fixed (from the YAML)" on
    # every row says nothing and takes the width the failure reasons need.
    show_placement = any(text != FIXED_TEXT for cells in placed.values() for text in cells.values())
    header = [col for col in ("RUN", "BACKEND", "JOBID", "COMPONENT", "STATE", "NODES", "PLACEMENT", "ELAPSED",
                              "RESTARTS", "PREEMPT", "FAILED", "WORK LOST", "REASON")
              if col != "PLACEMENT" or show_placement]
    rows = []
    for run in chosen:
        st = results[run.run_dir]
        # Whole-run figures on the run's first line, from the same functions as
        # `hetrun report` (report_attempts), so the two commands agree.
        mine = local[run.run_dir]
        lost, failed = mine["work_lost"], mine["failure"]
        for i, comp in enumerate(st.components):
            first = i == 0
            where = [placed[run.run_dir].get(comp.name, "-")] if show_placement else []
            rows.append([
                Path(run.run_dir).name if first else "",
                run.backend if first else "",
                comp.job_id or run.job_id or "-",
                comp.name, comp.state, comp.nodes or "-", *where, _elapsed(comp.elapsed_s),
                _restarts_text(mine["restarts"], comp.restarts) if first else "",
                str(mine["preemptions"]) if first else "",
                str(mine["failures"]) if first else "",
                ("-" if lost is None else str(lost)) if first else "",
                " ".join(_reason(comp, failed, first, [c.name for c in st.components]).split()),
            ])
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    _echo(_table_text(header, rows, width))
    for run in chosen:  # node failures recovered inside the allocation (spare_nodes): what, where from
        for line in local[run.run_dir]["node_failures"]:
            _echo(f"{Path(run.run_dir).name}: {line}")

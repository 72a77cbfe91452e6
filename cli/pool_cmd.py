"""`hetrun pool [--json] [--watch N] [--hours H]`: the compute pool, from sinfo, squeue, sacct and sshare.

Thin: ``hetrun.slurm_plugin.pool.collect`` does one call each of sinfo,
squeue, sacct and sshare; this module prints one table per partition and
GRES type, pending demand, fair share and troubled nodes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer


def _pct(used: int, total: int) -> str:
    return f"{used}/{total} ({100 * used / total:.0f}%)" if total else f"{used}/0"


def _tres(tres: dict[str, int]) -> str:
    return ",".join(f"{k}={n}" for k, n in sorted(tres.items())) or "-"


def _render(snap: Any) -> Any:
    from rich.console import Group
    from rich.table import Table

    parts = []
    pool = Table(title=f"pool ({time.strftime('%H:%M:%S', time.localtime(snap.taken_at))})")
    for col in ("partition", "gres", "nodes idle/mixed/alloc/drained/down", "CPUs alloc", "GPUs alloc",
                "memory MB alloc"):
        pool.add_column(col)
    for r in snap.rows:
        n = r.nodes
        states = "/".join(str(n.get(s, 0)) for s in ("idle", "mixed", "allocated", "drained", "down"))
        if n.get("other"):
            states += f" (+{n['other']} other)"
        pool.add_row(r.partition, r.gres, states, _pct(r.cpus_alloc, r.cpus_total),
                     _pct(r.gpus_alloc, r.gpus_total), _pct(r.mem_alloc_mb, r.mem_total_mb))
    parts.append(pool)
    pend = Table(title=f"pending demand ({snap.running_jobs} jobs running)")
    for col in ("partition", "jobs", "requested TRES"):
        pend.add_column(col)
    for p in snap.pending:
        pend.add_row(p.partition, str(p.jobs), _tres(p.tres))
    if not snap.pending:
        pend.add_row("-", "0", "-")
    parts.append(pend)
    acc = Table(title=f"accounts: fair share and allocated share over the last {snap.hours:g} h")
    for col in ("account", "shares", "fairshare", "effective usage", "CPU share", "GPU share"):
        acc.add_column(col)
    for a in snap.accounts:
        acc.add_row(a.account, "-" if a.raw_shares is None else str(a.raw_shares),
                    "-" if a.fairshare is None else f"{a.fairshare:.3f}",
                    "-" if a.effective_usage is None else f"{a.effective_usage:.3f}",
                    f"{100 * a.cpu_share:.0f}%", f"{100 * a.gpu_share:.0f}%")
    parts.append(acc)
    if snap.troubled:
        bad = Table(title="nodes with trouble (down/drain reasons, NODE_FAIL jobs in the window)")
        for col in ("node", "state", "reason", "since", "NODE_FAIL jobs"):
            bad.add_column(col)
        for t in snap.troubled:
            since = time.strftime("%m-%d %H:%M", time.localtime(t.since)) if t.since else "-"
            bad.add_row(t.node, t.state, t.reason or "-", since, str(t.failed_jobs))
        parts.append(bad)
    return Group(*parts)


def _print_fit(job: Path, hours: float) -> None:
    """Each component's needs and candidates against the pool, best first, with why the others
    lost: the placement section of ``hetrun plan --explain``."""
    from hetrun.dag.spec import load_spec
    from hetrun.slurm_plugin.placement_fit import explain, explain_lines

    for line in explain_lines(explain(load_spec(job), hours=hours)):
        typer.echo(line)


def pool(
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
    fit: Annotated[Optional[Path], typer.Option(help="Score where each component of this job YAML "
                                                "would fit best now (placement candidates).")] = None,
    watch: Annotated[Optional[float], typer.Option(help="Refresh every N seconds until Ctrl-C.")] = None,
    hours: Annotated[float, typer.Option(help="Window of the allocated-share history (sacct).")] = 6.0,
) -> None:
    """The pool: nodes, CPUs, GPUs and memory per partition and GRES type, pending demand,
    fair share, allocated share and troubled nodes (sinfo/squeue --json, sacct -P, sshare)."""
    from hetrun.slurm_plugin.pool import collect

    from hetrun.errors import HetrunError

    if hours <= 0 or hours > 24 * 90:
        raise HetrunError(f"--hours {hours:g} is out of range", hint="give 0 < hours <= 2160")
    if watch is not None and watch < 1:
        raise HetrunError(f"--watch {watch:g} is too short", hint="refresh at most once a second")
    if fit is not None:
        _print_fit(fit, hours)
        return
    if as_json:
        typer.echo(json.dumps(collect(hours=hours).to_json(), indent=1))
        return
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if watch is None:
        console.print(_render(collect(hours=hours)))
        return
    with Live(_render(collect(hours=hours)), console=console, refresh_per_second=1) as live:
        while True:
            time.sleep(watch)
            live.update(_render(collect(hours=hours)))


def register(app: typer.Typer) -> None:
    app.command("pool")(pool)

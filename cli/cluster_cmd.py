"""`hetrun cluster up|status|down`: the real local Slurm cluster for tests and demos.

Thin: the work is in ``hetrun.slurm_plugin.cluster``; this module only parses
options and prints. Note that each emulated node has a private /tmp: job files
must live outside /tmp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

cluster_app = typer.Typer(
    name="cluster",
    help="A real multi-node Slurm cluster on this host (munge, slurmdbd, slurmctld, N slurmd).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@cluster_app.command("up")
def up_cmd(
    nodes: Annotated[Optional[int], typer.Option(help="Emulated nodes (default: as last time, else 4).")] = None,
    cpus: Annotated[Optional[int], typer.Option(help="CPUs per node (default: as last time, else 2).")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="Emulated GPUs per node (default: as last time, else 2).")] = None,
    mem_mb: Annotated[Optional[int], typer.Option("--mem-mb", help="Memory per node in MB (default: as last time, else 4000).")] = None,
    gpu_types: Annotated[Optional[str], typer.Option(
        "--gpu-types", help="Pool shape: GRES types, comma-separated (a100,v100): the GPU nodes split between "
                            "them, one partition gpu-<type> each; '' for untyped GPUs (default: as last time).")] = None,
    cpu_nodes: Annotated[Optional[int], typer.Option(
        "--cpu-nodes", help="Pool shape: the last N nodes have no GPU, in partition cpu (default: as last time, else 0).")] = None,
    no_install: Annotated[bool, typer.Option("--no-install", help="Do not apt-get install missing packages.")] = False,
    policy: Annotated[Optional[Path], typer.Option(
        help="Pool policy YAML to run with (see docs/POLICY.md): its slurm.conf settings and job_submit.lua "
             "are written in, then its QOS/accounts applied. Kept for later `up`s.")] = None,
    no_policy: Annotated[bool, typer.Option("--no-policy", help="Drop the policy a previous `up --policy` set.")] = False,
) -> None:
    """Start (or repair) the cluster; idempotent and quick when it is already up."""
    import dataclasses
    import time

    from hetrun.slurm_plugin import cluster
    from hetrun.slurm_plugin.cluster_conf import node_groups

    saved = cluster.load_config()
    wanted: dict[str, object] = {
        k: v for k, v in {"nodes": nodes, "cpus": cpus, "gpus": gpus, "mem_mb": mem_mb,
                          "cpu_nodes": cpu_nodes}.items() if v is not None}
    if gpu_types is not None:
        wanted["gpu_types"] = tuple(t.strip() for t in gpu_types.split(",") if t.strip())
    if policy is not None and no_policy:
        raise typer.BadParameter("give --policy FILE or --no-policy, not both")
    if policy is not None:
        from hetrun.slurm_plugin.policy.model import load_policy

        load_policy(policy)  # file:line:col errors before any daemon is touched
        wanted["policy"] = str(policy.resolve())
    elif no_policy:
        wanted["policy"] = None
    cfg = dataclasses.replace(saved, **wanted)  # validates the shape (SlurmError) before anything starts
    t0 = time.monotonic()
    st = cluster.up(cfg, install=not no_install)
    typer.echo(
        f"cluster {cluster.CLUSTER_NAME} up in {time.monotonic() - t0:.1f} s: "
        f"{cfg.nodes} nodes x {cfg.cpus} CPUs, {cfg.gpus} GPUs, {cfg.mem_mb} MB; "
        f"partitions debug (default), high (preempts)"
        + "".join(f", {g.partition} ({g.names})" for g in node_groups(cfg) if g.partition)
        + (f"; policy {cfg.policy}" if cfg.policy else "")
    )
    _print_status(st)


@cluster_app.command("status")
def status_cmd() -> None:
    """Nodes (sinfo) and each daemon with its pid; exit 3 when the cluster is not healthy."""
    from hetrun.slurm_plugin import cluster

    from hetrun.errors import SlurmError

    st = cluster.status()
    _print_status(st)
    if not st.healthy:
        raise SlurmError(
            "local cluster is not healthy" + (f": {st.error}" if st.error else ""),
            hint="`hetrun cluster up` starts what is down",
        )


@cluster_app.command("down")
def down_cmd() -> None:
    """Stop the daemons `up` started (configs and accounting data are kept)."""
    from hetrun.slurm_plugin import cluster

    stopped = cluster.down()
    typer.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


def _print_status(st: object) -> None:
    from hetrun.slurm_plugin.cluster import USABLE_STATES, ClusterStatus
    from rich.console import Console
    from rich.table import Table

    assert isinstance(st, ClusterStatus)
    console = Console()
    if st.config is None:
        console.print(st.error or "no local cluster")
        return
    nodes = Table(title="nodes (sinfo)")
    for col in ("node", "state", "cpus", "memory MB", "gres", "partitions"):
        nodes.add_column(col)
    for n in st.nodes:
        style = "green" if n.state == "idle" else ("yellow" if n.state in USABLE_STATES else "red")
        nodes.add_row(n.name, f"[{style}]{n.state}[/]", str(n.cpus), str(n.memory_mb), n.gres,
                      ",".join(n.partitions))
    console.print(nodes)
    daemons = Table(title="daemons")
    for col in ("daemon", "pid", "alive", "started by hetrun"):
        daemons.add_column(col)
    for d in st.daemons:
        daemons.add_row(d.name, str(d.pid or "-"), "[green]yes[/]" if d.alive else "[red]no[/]",
                        "yes" if d.ours else "no")
    console.print(daemons)
    link = st.config.slurm_etc / "slurm.conf"
    console.print(f"config: {st.config.directory}/etc  ({link} -> "
                  f"{'linked' if st.slurm_conf_linked else 'NOT linked'})")
    console.print(f"logs:   {st.config.directory}/log")
    console.print("note: each node has a private /tmp; put job files outside /tmp (e.g. /var/tmp).")
    if st.error:
        console.print(f"[red]{st.error}[/]")


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")

"""`hetrun ckpt ls|show|verify|gc|export RUN`: inspect and maintain a run's checkpoints.

RUN is a run directory, a run name (prefix) or a Slurm job id (resolved with
``hetrun.slurm_plugin.rundir.find_run``), or a checkpoint store directory
itself. The store is the run's ``checkpoint.directory`` from plan.json, else
``<run_dir>/ckpt``. Thin: the work is in ``hetrun.runtime.ckpt``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

ckpt_app = typer.Typer(
    name="ckpt",
    help="Inspect, verify, clean and export a run's checkpoints.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

RunArg = Annotated[str, typer.Argument(help="Run directory, run name (prefix), Slurm job id, or a checkpoint store directory.")]
RunsDir = Annotated[Optional[str], typer.Option("--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
                                                help="Where runs live (default ./runs).")]
LocalDir = Annotated[Optional[str], typer.Option("--local-dir", help="Also read this node-local tier.")]


def store_dir(ref: str, runs_dir: str | None) -> Path:
    """The checkpoint store directory that ``ref`` names."""
    from hetrun.dag.errors import RunDirError

    path = Path(ref).expanduser()
    if (path / "manifests").is_dir():
        return path
    from hetrun.slurm_plugin.rundir import find_run, runs_root

    run_dir = Path(find_run(ref, runs_root(runs_dir)).run_dir)
    directory = None
    plan = run_dir / "plan.json"
    if plan.is_file():
        try:
            directory = (json.loads(plan.read_text()).get("checkpoint") or {}).get("directory")
        except ValueError as exc:
            raise RunDirError(f"{plan} is not JSON ({exc})", hint="the run directory is damaged") from exc
    ckpt = Path(directory) if directory else run_dir / "ckpt"
    if not ckpt.is_absolute():
        ckpt = run_dir / ckpt
    if not (ckpt / "manifests").is_dir():
        raise RunDirError(f"run {run_dir.name} has no checkpoints yet (looked in {ckpt})",
                          hint="checkpoints appear after the first checkpoint interval")
    return ckpt


def _open(ref: str, runs_dir: str | None, local_dir: str | None) -> Any:
    from hetrun.runtime.ckpt import open_store

    return open_store(store_dir(ref, runs_dir), local_dir)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


@ckpt_app.command("ls")
def ls_cmd(run: RunArg, runs_dir: RunsDir = None, local_dir: LocalDir = None) -> None:
    """List checkpoints: step, time, size, bytes stored (new), delta ratio, save times."""
    store = _open(run, runs_dir, local_dir)
    rows = store.info()
    if not rows:
        typer.echo("no checkpoints")
        return
    head = f"{'STEP':>8}  {'CREATED (UTC)':19}  {'RANKS':>5}  {'STATE MB':>9}  {'NEW MB':>8}  {'RATIO':>6}  {'STALL s':>7}  {'WRITE s':>7}  TIERS"
    typer.echo(head)
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.created))
        typer.echo(f"{r.step:>8}  {created:19}  {r.world_size:>5}  {_mb(r.raw_bytes):>9}  {_mb(r.stored_bytes):>8}  "
                   f"{r.delta_ratio:>6.3f}  {r.stall_s:>7.3f}  {r.write_s:>7.2f}  {','.join(r.tiers)}")


@ckpt_app.command("show")
def show_cmd(run: RunArg, step: Annotated[Optional[int], typer.Option(help="Step (default: newest).")] = None,
             runs_dir: RunsDir = None, local_dir: LocalDir = None) -> None:
    """Show one checkpoint's manifest: ranks, shard stats, metadata."""
    from hetrun.dag.errors import CheckpointError

    store = _open(run, runs_dir, local_dir)
    steps = store.steps()
    if not steps:
        raise CheckpointError("no checkpoints in this store")
    chosen = steps[0] if step is None else step
    for tier in store.tiers:
        if chosen in tier.manifest_steps():
            doc = tier.read_manifest(chosen)
            break
    else:
        raise CheckpointError(f"no checkpoint at step {chosen}", hint=f"steps: {sorted(steps)}")
    typer.echo(f"step {chosen}  tier {tier.name}  {tier.manifest_path(chosen)}")
    typer.echo(f"created {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(doc.get('created', 0)))} UTC, "
               f"{doc['world_size']} rank(s)")
    if doc.get("meta"):
        typer.echo(f"meta {json.dumps(doc['meta'], sort_keys=True)}")
    for s in doc["shards"]:
        st = s.get("stats", {})
        typer.echo(f"  rank {s['rank']:>4}: {s['path']}  state {_mb(st.get('raw_bytes', 0))} MB, "
                   f"new {_mb(st.get('stored_bytes', 0))} MB, stall {st.get('stall_s', 0):.3f}s, "
                   f"write {st.get('write_s', 0):.2f}s")


@ckpt_app.command("verify")
def verify_cmd(run: RunArg, step: Annotated[Optional[int], typer.Option(help="Only this step.")] = None,
               runs_dir: RunsDir = None, local_dir: LocalDir = None) -> None:
    """Decode every chunk of every rank and check its hash; exit 5 if any checkpoint is invalid."""
    from hetrun.dag.errors import CheckpointError

    store = _open(run, runs_dir, local_dir)
    steps = [step] if step is not None else sorted(store.steps())
    bad = 0
    for s in steps:
        t0 = time.perf_counter()
        problems = store.verify(s)
        if problems:
            bad += 1
            typer.echo(f"step {s}: INVALID")
            for p in problems:
                typer.echo(f"  {p}")
        else:
            typer.echo(f"step {s}: ok ({time.perf_counter() - t0:.2f}s)")
    if bad:
        raise CheckpointError(f"{bad} of {len(steps)} checkpoint(s) failed verification",
                              hint="restore falls back to the newest valid one; `hetrun ckpt gc` keeps the store tidy")


@ckpt_app.command("gc")
def gc_cmd(run: RunArg,
           keep: Annotated[Optional[int], typer.Option(help="Also delete all but the newest KEEP checkpoints.")] = None,
           runs_dir: RunsDir = None, local_dir: LocalDir = None) -> None:
    """Delete chunks and shards no checkpoint references (never ones newer than the newest checkpoint)."""
    from hetrun.runtime.ckpt import gc, retain

    store = _open(run, runs_dir, local_dir)
    for tier in store.tiers:
        dropped = retain(tier, keep) if keep is not None else []
        files, freed = gc(tier)
        typer.echo(f"{tier.name}: removed {len(dropped)} checkpoint(s){' ' + str(dropped) if dropped else ''}, "
                   f"{files} file(s), {_mb(freed)} MB freed")


@ckpt_app.command("export")
def export_cmd(run: RunArg,
               out: Annotated[Path, typer.Option("--out", "-o", help="Output file (torch) or directory (dcp).")],
               fmt: Annotated[str, typer.Option("--format", help="torch (torch.save file) or dcp (torch.distributed.checkpoint).")] = "torch",
               step: Annotated[Optional[int], typer.Option(help="Step (default: newest valid).")] = None,
               rank: Annotated[Optional[int], typer.Option(help="Only this rank's state.")] = None,
               runs_dir: RunsDir = None, local_dir: LocalDir = None) -> None:
    """Export a checkpoint to a plain torch.save state dict or to DCP format."""
    from hetrun.dag.errors import CheckpointError
    from hetrun.runtime.ckpt.export import export

    store = _open(run, runs_dir, local_dir)
    if step is None:
        for s in store.steps():
            if not store.verify(s):
                step = s
                break
        else:
            raise CheckpointError("no valid checkpoint to export")
    path = export(store, step, out, fmt, rank)
    typer.echo(f"exported step {step} ({fmt}) to {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(ckpt_app, name="ckpt")

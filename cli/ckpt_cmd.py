"""`hetrun ckpt ls|show|verify|gc|export RUN`: inspect and maintain a run's checkpoints.

RUN is a run directory, a run name (prefix) or a Slurm job id (resolved with
``hetrun.slurm_plugin.rundir.find_run``), a checkpoint store directory
itself, or an object-store URL ``s3://bucket/prefix[/component]`` (a job's
``checkpoint.object_store.url``; endpoint from ``--endpoint`` or
``AWS_ENDPOINT_URL``, credentials from the standard AWS places). A run's checkpoints live in ``checkpoint.directory`` from plan.json,
else ``<run_dir>/ckpt``, one store per component (``ckpt/<component>/``);
``--component`` picks one, by default every component is shown. Thin: the
work is in ``hetrun.runtime.ckpt``.
"""

from __future__ import annotations

import atexit
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

RunArg = Annotated[str, typer.Argument(help="Run directory, run name (prefix), Slurm job id, a checkpoint store "
                                            "directory, or s3://BUCKET/PREFIX (a job's checkpoint.object_store.url).")]
RunsDir = Annotated[Optional[str], typer.Option("--runs-dir", envvar="HETRUN_RUNS", show_envvar=True,
                                                help="Where runs live (default ./runs).")]
LocalDir = Annotated[Optional[str], typer.Option("--local-dir", help="Also read this node-local tier.")]
Endpoint = Annotated[Optional[str], typer.Option("--endpoint", envvar="AWS_ENDPOINT_URL", show_envvar=True,
                                                 help="S3 endpoint for an s3:// RUN (default: AWS).")]


Component = Annotated[Optional[str], typer.Option("--component", "-c", help="Only this component's store.")]


def _is_store(path: Path) -> bool:
    return (path / "manifests").is_dir()


def store_dirs(ref: str, runs_dir: str | None, component: str | None = None) -> list[tuple[str, Path]]:
    """(label, store directory) for every store ``ref`` names."""
    from hetrun.errors import RunDirError

    root = store_root(ref, runs_dir)
    if _is_store(root):
        return [(root.name, root)]
    found = sorted((p.name, p) for p in root.iterdir() if p.is_dir() and _is_store(p)) if root.is_dir() else []
    found = _only_component(found, component, root)
    if not found:
        raise RunDirError(f"no checkpoints yet in {root}",
                          hint="checkpoints appear after the first checkpoint interval")
    return found


def store_root(ref: str, runs_dir: str | None) -> Path:
    """The checkpoint directory that ``ref`` names (a store, or one store per component)."""

    path = Path(ref).expanduser()
    if _is_store(path):
        return path
    from hetrun.slurm_plugin.rundir import find_run, runs_root

    run_dir = Path(find_run(ref, runs_root(runs_dir)).run_dir)
    from hetrun.runtime.plan_view import PLAN_FILE, checkpoint_root, load_plan

    if not (run_dir / PLAN_FILE).is_file():  # a bare store directory's parent, or an old run
        return checkpoint_root(run_dir, None)
    return load_plan(run_dir, validate=False).checkpoint_root(run_dir)


def _buckets(ref: str, endpoint: str | None, component: str | None) -> list[tuple[str, Any]]:
    """(label, ObjectStore) for every component store an s3:// URL names."""
    from hetrun.dag.object_store_spec import check_endpoint, parse_url
    from hetrun.runtime.ckpt.object_store import ObjectStore, component_stores

    from hetrun.errors import CheckpointError, RunDirError

    try:
        url = parse_url(ref)
        endpoint = check_endpoint(endpoint) if endpoint else None
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    found = component_stores(ObjectStore(url, endpoint=endpoint))
    found = _only_component(found, component, ref)
    if not found:
        raise RunDirError(f"no checkpoints in {ref}", hint="the bucket holds a checkpoint once its first upload committed")
    return found


def _open(ref: str, runs_dir: str | None, local_dir: str | None, component: str | None = None,
          endpoint: str | None = None) -> list[tuple[str, Any]]:
    from hetrun.runtime.ckpt import open_store

    if ref.startswith("s3://"):
        from hetrun.runtime.ckpt import CheckpointStore
        from hetrun.runtime.ckpt.object_tier import BucketTier

        opened = []
        for label, obj in _buckets(ref, endpoint, component):
            tier = BucketTier(obj)
            atexit.register(tier.close)  # its download cache
            opened.append((label, CheckpointStore([tier], threads=4)))
        return opened
    out = []
    for label, path in store_dirs(ref, runs_dir, component):
        local = Path(local_dir) / label if local_dir and not _is_store(Path(local_dir)) else local_dir
        out.append((label, open_store(path, local)))
    return out


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _section(label: str, many: bool) -> None:
    if many:
        typer.echo(f"== component {label}")


@ckpt_app.command("ls")
def ls_cmd(run: RunArg, component: Component = None, runs_dir: RunsDir = None, local_dir: LocalDir = None,
           endpoint: Endpoint = None) -> None:
    """List checkpoints: step, time, size, bytes stored (new), delta ratio, save times."""
    stores = _open(run, runs_dir, local_dir, component, endpoint)
    for label, store in stores:
        _section(label, len(stores) > 1)
        rows = store.info()
        if not rows:
            typer.echo("no checkpoints")
            continue
        typer.echo(f"{'STEP':>8}  {'CREATED (UTC)':19}  {'RANKS':>5}  {'STATE MB':>9}  {'NEW MB':>8}  "
                   f"{'RATIO':>6}  {'STALL s':>7}  {'WRITE s':>7}  TIERS")
        for r in rows:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.created))
            typer.echo(f"{r.step:>8}  {created:19}  {r.world_size:>5}  {_mb(r.raw_bytes):>9}  "
                       f"{_mb(r.stored_bytes):>8}  {r.delta_ratio:>6.3f}  {r.stall_s:>7.3f}  "
                       f"{r.write_s:>7.2f}  {','.join(r.tiers)}")


@ckpt_app.command("show")
def show_cmd(run: RunArg, step: Annotated[Optional[int], typer.Option(help="Step (default: newest).")] = None,
             component: Component = None, runs_dir: RunsDir = None, local_dir: LocalDir = None,
           endpoint: Endpoint = None) -> None:
    """Show one checkpoint's manifest: ranks, shard stats, metadata."""
    from hetrun.errors import CheckpointError

    stores = _open(run, runs_dir, local_dir, component, endpoint)
    for label, store in stores:
        _section(label, len(stores) > 1)
        steps = store.steps()
        if not steps:
            raise CheckpointError(f"no checkpoints in {label}")
        chosen = steps[0] if step is None else step
        for tier in store.tiers:
            if chosen in tier.manifest_steps():
                doc = tier.read_manifest(chosen)
                break
        else:
            raise CheckpointError(f"{label}: no checkpoint at step {chosen}", hint=f"steps: {sorted(steps)}")
        where = f"{tier.location()}/manifests/{chosen:012d}.json" if hasattr(tier, "location") else tier.manifest_path(chosen)
        typer.echo(f"step {chosen}  tier {tier.name}  {where}")
        typer.echo(f"created {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(doc.get('created', 0)))} UTC, "
                   f"{doc['world_size']} rank(s)")
        if doc.get("meta"):
            typer.echo(f"meta {json.dumps(doc['meta'], sort_keys=True)}")
        for sh in doc["shards"]:
            st = sh.get("stats", {})
            typer.echo(f"  rank {sh['rank']:>4}: {sh['path']}  state {_mb(st.get('raw_bytes', 0))} MB, "
                       f"new {_mb(st.get('stored_bytes', 0))} MB, stall {st.get('stall_s', 0):.3f}s, "
                       f"write {st.get('write_s', 0):.2f}s")


@ckpt_app.command("verify")
def verify_cmd(run: RunArg, step: Annotated[Optional[int], typer.Option(help="Only this step.")] = None,
               component: Component = None, runs_dir: RunsDir = None, local_dir: LocalDir = None,
           endpoint: Endpoint = None) -> None:
    """Decode every chunk of every rank and check its hash; exit 5 if any checkpoint is invalid."""
    from hetrun.errors import CheckpointError

    stores = _open(run, runs_dir, local_dir, component, endpoint)
    bad = total = 0
    for label, store in stores:
        _section(label, len(stores) > 1)
        steps = [step] if step is not None else sorted(store.steps())
        for s in steps:
            total += 1
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
        raise CheckpointError(f"{bad} of {total} checkpoint(s) failed verification",
                              hint="restore falls back to the newest valid one; `hetrun ckpt gc --keep N` drops old ones")


@ckpt_app.command("gc")
def gc_cmd(run: RunArg,
           keep: Annotated[Optional[int], typer.Option(help="Also delete all but the newest KEEP checkpoints.")] = None,
           component: Component = None, runs_dir: RunsDir = None, local_dir: LocalDir = None,
           endpoint: Endpoint = None) -> None:
    """Delete chunks and shards no checkpoint references (never ones newer than the newest checkpoint)."""
    from hetrun.runtime.ckpt import gc, retain

    if run.startswith("s3://"):
        for label, obj in _buckets(run, endpoint, component):
            dropped = obj.retain(keep) if keep is not None else []
            files, freed, why = obj.gc()
            typer.echo(f"{label} (object): removed {len(dropped)} checkpoint(s)"
                       f"{' ' + str(dropped) if dropped else ''}, {files} object(s), {_mb(freed)} MB freed"
                       + (f"; {why}" if why else ""))
        return
    for label, store in _open(run, runs_dir, local_dir, component):
        for tier in store.tiers:
            dropped = retain(tier, keep) if keep is not None else []
            files, freed = gc(tier)
            typer.echo(f"{label} ({tier.name}): removed {len(dropped)} checkpoint(s)"
                       f"{' ' + str(dropped) if dropped else ''}, {files} file(s), {_mb(freed)} MB freed")


@ckpt_app.command("export")
def export_cmd(run: RunArg,
               out: Annotated[Path, typer.Option("--out", "-o", help="Output file (torch) or directory (dcp).")],
               fmt: Annotated[str, typer.Option("--format", help="torch (torch.save file) or dcp (torch.distributed.checkpoint).")] = "torch",
               step: Annotated[Optional[int], typer.Option(help="Step (default: newest valid).")] = None,
               rank: Annotated[Optional[int], typer.Option(help="Only this rank's state.")] = None,
               component: Component = None, runs_dir: RunsDir = None, local_dir: LocalDir = None,
           endpoint: Endpoint = None) -> None:
    """Export a checkpoint to a plain torch.save state dict or to DCP format."""
    from hetrun.runtime.ckpt.export import export

    from hetrun.errors import CheckpointError

    stores = _open(run, runs_dir, local_dir, component, endpoint)
    if len(stores) > 1:
        raise CheckpointError(f"this run has checkpoints for {len(stores)} components",
                              hint="choose one with --component " + " | ".join(n for n, _ in stores))
    _label, store = stores[0]
    if step is None:
        for s in store.steps():
            if not store.verify(s):
                step = s
                break
        else:
            raise CheckpointError("no valid checkpoint to export")
    path = export(store, step, out, fmt, rank)
    typer.echo(f"exported step {step} ({fmt}) to {path}")


def _import_target(ref: str, runs_dir: str | None) -> Path:
    """A run directory: an existing directory or a path given as such (the API's
    HETRUN_RUN_DIR, created if missing), else a run name or Slurm job id."""
    path = Path(ref).expanduser()
    if path.is_dir() or "/" in ref:
        return path.absolute()
    from hetrun.slurm_plugin.rundir import find_run, runs_root

    return Path(find_run(ref, runs_root(runs_dir)).run_dir)


@ckpt_app.command("import")
def import_cmd(
    source: Annotated[Path, typer.Argument(metavar="FILE", help="A torch.save file, or a DCP checkpoint directory.")],
    into: Annotated[str, typer.Option("--into", help="Run directory (created if missing: HETRUN_RUN_DIR of a "
                                                     "script using the run API), run name or Slurm job id.")],
    component: Annotated[str, typer.Option("--component", "-c", help="The component whose store to seed "
                                           "(a script's HETRUN_COMPONENT; the run API's default is train).")] = "train",
    ranks: Annotated[int, typer.Option("--ranks", help="Ranks of the run that will restore it: each gets the "
                                                       "same state (replicated, as DDP).")] = 1,
    step: Annotated[Optional[int], typer.Option("--step", help="The last step done (default: the file's "
                                                               "'step' entry); restore returns STEP + 1.")] = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle", help="Allow reading a DCP directory, whose "
                                               ".metadata is a pickle that can run code. Only for trusted files.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the RNG states stored with it "
                                                     "(a torch.save file holds none).")] = 0,
    runs_dir: RunsDir = None,
) -> None:
    """Seed a run's checkpoints from a torch.save file or a DCP directory.

    The file is read with torch.load(weights_only=True) only, never a full unpickle:
    tensors, containers and plain values. Each top-level key becomes a name that
    run.restore({...}) loads (e.g. {"model": ..., "optim": ...}). A DCP directory
    needs --trust-pickle (its metadata is a pickle).
    """
    from hetrun.runtime.api.importer import import_into
    from hetrun.runtime.api.reader import store_dir
    from hetrun.runtime.plan_view import checkpoint_root

    from hetrun.errors import CheckpointError

    run_dir = _import_target(into, runs_dir)
    target = checkpoint_root(run_dir, None) / component  # where the run API (and so the import) writes
    if run_dir.is_dir() and store_dir(run_dir, component) != target:
        raise CheckpointError(f"{run_dir} keeps its checkpoints in {store_dir(run_dir, component)} "
                              f"(checkpoint.directory), not in {target}, where an import writes",
                              hint="import into a run without checkpoint.directory")
    start = import_into(source, run_dir, component=component, ranks=ranks, step=step,
                        trust_pickle=trust_pickle, seed=seed)
    typer.echo(f"imported {source} into {target} for {ranks} rank(s): "
               f"run.restore() starts at step {start}")


def register(app: typer.Typer) -> None:
    app.add_typer(ckpt_app, name="ckpt")


def _only_component(found: list[tuple[str, Any]], component: str | None, where: Any) -> list[tuple[str, Any]]:
    """The stores of ``component`` (all when None); an unknown name is refused with the close match."""
    from hetrun.errors import RunDirError, closest

    if component is None:
        return found
    names = [n for n, _ in found]
    if component not in names:
        near = closest(component, names)
        raise RunDirError(f"no checkpoints for component {component!r} in {where}",
                          hint=(f"did you mean {near!r}? " if near else "")
                          + f"components with checkpoints: {', '.join(names) or 'none'}")
    return [(n, s) for n, s in found if n == component]

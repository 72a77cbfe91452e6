"""Where a run's checkpoints and events go when the user's own script runs.

In order: ``attach(run_dir=...)``; ``$HETRUN_RUN_DIR`` (set when hetrun
launched the script); else the runs directory (``$HETRUN_RUNS``, default
``./runs``; ``hetrun.rundir.runs_root``) /
``<Slurm job id>`` in a Slurm job (a requeued job keeps its id, so it finds
its checkpoints) or ``<name>`` outside Slurm (``attach(name=...)``, default
the script's file name). On Slurm a node-local directory is refused: the
other nodes and the requeued job (maybe on another node) could not see it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hetrun.runtime.api.env import RankEnv

from hetrun.errors import RunDirError
from hetrun.rundir import RUN_DIR_ENV, RUNS_ENV, node_local_root, runs_root


def _script_name() -> str:
    stem = Path(sys.argv[0] or "run").stem
    return stem if stem and stem not in ("-c", "-") else "run"


def resolve(env: RankEnv, run_dir: str | os.PathLike[str] | None, name: str | None) -> Path:
    if run_dir is not None:
        path, source = Path(run_dir), "attach(run_dir=...)"
    elif os.environ.get(RUN_DIR_ENV):
        path, source = Path(os.environ[RUN_DIR_ENV]), f"${RUN_DIR_ENV}"
    else:
        leaf = env.job_id or name or _script_name()
        if "/" in leaf or leaf in (".", ".."):
            raise RunDirError(f"run name {leaf!r} is not a plain directory name",
                              hint="pass attach(name=...) without '/' or '..'")
        path = runs_root() / leaf
        source = f"${RUNS_ENV}/<job id or name>"
    path = path.expanduser().absolute()
    local = node_local_root(path)
    if env.job_id and local:
        raise RunDirError(
            f"run directory {path} (from {source}) is under {local}, which is node-local on Slurm: "
            "the other nodes and the requeued job could not see its checkpoints",
            hint=f"set {RUN_DIR_ENV} or attach(run_dir=...) to a directory on a shared file system")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run directory {path} (from {source}): {exc.strerror}",
                          hint=f"set {RUN_DIR_ENV} or attach(run_dir=...) to a writable directory") from exc
    return path

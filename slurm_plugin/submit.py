"""spec -> plan -> run directory -> script -> backend.submit, and waiting for the end.

Everything that can be rejected (spec, plan, rendering) is checked before
anything is written, so a refused job leaves no half-made run directory. A
dry run writes nothing at all: it returns the script and the command that
``submit`` would run.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import HetrunError, RunDirError, SlurmError, SpecError
from hetrun.rundir import node_local_root

from . import quoting
from .backends import get_backend, resolve_name
from .backends.base import ACTIVE_STATES, Backend, DryRun, RunStatus
from .backends.sbatch import SbatchBackend
from .prequeue import check_commands
from .render import render_sbatch
from .rundir import (
    JOB_YAML,
    LOGS,
    PLAN_JSON,
    SCRIPT,
    RunInfo,
    new_run_name,
    runs_root,
    utc_now_iso,
    write_atomic,
    write_run,
)

if TYPE_CHECKING:
    from hetrun.dag.overrides import Overrides
    from hetrun.dag.plan import Plan
    from hetrun.dag.spec import JobSpec


@dataclass
class SubmitResult:
    run: RunInfo
    script: str
    backend: str
    dry_run: DryRun | None = None
    plan: Plan | None = None  # what plan.json holds (placement choices included)


def _check_checkpoint_dir(spec: JobSpec, run_dir: Path) -> None:
    """A relative checkpoint directory lives in the run directory and may not leave it."""
    directory = spec.checkpoint.directory
    if directory and not Path(directory).is_absolute():
        quoting.safe_join(run_dir, directory, "checkpoint.directory")


def _workload_in_job_dir(workload: str, job_dir: Path) -> bool:
    """Whether ``module:Class`` is imported from the job YAML's directory (found by its
    first module name, as sys.path order would: job_dir comes first on the ranks)."""
    top = workload.partition(":")[0].split(".")[0]
    return (job_dir / f"{top}.py").is_file() or (job_dir / top).is_dir()


def check_visible_to_nodes(spec: JobSpec, runs_root_dir: Path, job_dir: Path | None) -> None:
    """Refuse paths the Slurm nodes cannot see, before anything is queued."""
    problems = [("the runs directory", runs_root_dir, "use --runs-dir (or $HETRUN_RUNS) on a shared file system")]
    directory = spec.checkpoint.directory
    if directory and Path(directory).is_absolute():
        problems.append(("checkpoint.directory", Path(directory), "point checkpoint.directory at a shared file system"))
    if job_dir is not None and spec.workload is not None and _workload_in_job_dir(spec.workload, Path(job_dir)):
        problems.append((f"the workload module of {spec.workload} (next to the job YAML)", Path(job_dir),
                         "move the job YAML and its workload module to a shared directory"))
    for what, path, fix in problems:
        root = node_local_root(path)
        if root is not None:
            raise RunDirError(f"{what} is {path}, under {root}, which is private to each Slurm node: "
                              "the job's ranks would not find it", hint=fix + " (or use --backend local)")


def check_command_settings(spec: JobSpec) -> None:
    """Settings a command component would silently not get are refused, not ignored: the
    run API inside a command stops on USR1 (or SIGTERM), whatever the job's
    ``preemption.signal`` says. (It applies the checkpoint section and the budgets.)"""
    if not list(spec.command_components):
        return
    if spec.preemption.signal.upper().removeprefix("SIG") != "USR1":
        raise SpecError(f"preemption.signal={spec.preemption.signal!r}: the run API in a command "
                        "component stops on USR1 (and SIGTERM) only",
                        key_path="preemption.signal", hint="use preemption.signal: USR1 for a command job")


def resolve_job_dir(job_dir: str | Path) -> str:
    """The job YAML's directory as an absolute path the ranks can import workloads from."""
    path = Path(job_dir).expanduser().resolve()
    if not path.is_dir():
        raise RunDirError(f"job directory {path} (where the job YAML is) is not a directory",
                          hint="pass the directory that holds the job YAML")
    return str(path)


def plan_for(spec: JobSpec, backend: str, job_file: str | None = None) -> Plan:
    """Build the plan; against the cluster's real nodes when submitting to Slurm, after
    refusing a partition the cluster does not have (``prequeue.check_partitions``)."""
    from hetrun.dag.plan import build_plan

    capacities = None
    if backend in ("sbatch", "pyslurm"):
        from .inventory import capacities_of, node_inventory
        from .prequeue import check_partitions

        nodes = node_inventory()
        check_partitions(spec, nodes, file=job_file)
        capacities = None if nodes is None else capacities_of(nodes, spec.slurm.partition)
    return build_plan(spec, capacities=capacities)


def submit_spec(
    spec: JobSpec,
    *,
    backend: str | Backend = "auto",
    runs_dir: str | Path | None = None,
    dry_run: bool = False,
    python: str | None = None,
    plan: Plan | None = None,
    job_dir: str | Path | None = None,
    fit: bool = False,
    job_file: str | None = None,
) -> SubmitResult:
    """Submit a validated ``JobSpec``. ``plan`` defaults to ``plan_for(spec, backend)``.

    ``fit`` (``--fit``) places every component against the pool as ``placement: auto``
    components always are (``placement_fit.place``); the choices go into plan.json.

    ``job_dir`` (the directory of the job YAML) goes into plan.json as ``job_dir``:
    every rank, on any node, imports workload modules kept next to the YAML from it.
    ``job_file`` (the job YAML's path) only names the file in an error.
    """
    check_command_settings(spec)
    backend_obj = get_backend(backend) if isinstance(backend, str) else backend
    check_commands(spec, Path(job_dir) if job_dir is not None else None, to_slurm=backend_obj.name != "local",
                   file=job_file)
    if plan is None:
        plan = plan_for(spec, backend_obj.name, job_file)
    if job_dir is not None:
        plan = plan.model_copy(update={"job_dir": resolve_job_dir(job_dir)})
    from .placement_fit import place

    plan = place(spec, plan, backend_obj, fit_all=fit)
    root = runs_root(runs_dir)
    quoting.sbatch_path(root, "runs directory")
    if backend_obj.name != "local":
        check_visible_to_nodes(spec, root, Path(job_dir) if job_dir is not None else None)

    for _ in range(16):
        run_dir = root / quoting.check_relative_part(new_run_name(spec.name), "name")
        if not run_dir.exists():
            break
    else:
        raise RunDirError(f"could not find a free run directory name for {spec.name!r} in {root}")
    _check_checkpoint_dir(spec, run_dir)
    script = render_sbatch(plan, spec, run_dir, python=python)
    run = RunInfo(name=spec.name, run_dir=str(run_dir), backend=backend_obj.name,
                  components=[c.name for c in plan.components])

    if dry_run:
        return SubmitResult(run, script, backend_obj.name, backend_obj.dry_run(run, script, plan), plan)

    try:
        root.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
        (run_dir / LOGS).mkdir()
    except OSError as exc:
        raise RunDirError(f"cannot create run directory {run_dir}: {exc.strerror}",
                          hint="choose a writable --runs-dir (or $HETRUN_RUNS)") from exc
    quoting.inside(root, run_dir, "run directory")
    write_atomic(run_dir / JOB_YAML, spec.to_yaml())
    write_atomic(run_dir / PLAN_JSON, plan.to_json())
    write_atomic(run_dir / SCRIPT, script)
    (run_dir / SCRIPT).chmod(0o755)
    write_run(run)

    try:
        job_id = backend_obj.submit(run)
    except HetrunError as exc:
        if isinstance(exc, SlurmError) and exc.uncertain:
            # sbatch timed out: the controller may have queued the job, which then needs its
            # run directory; keep it and say so.
            exc.message += f" (the job may have been queued: check squeue; {run_dir} is kept)"
            raise
        # A refused submit leaves nothing behind: `hetrun status` would list a run that never
        # queued. The directory is the one made just above (mkdir without exist_ok). An
        # interrupt (Ctrl-C) is not a refusal: the directory stays, as the job may be queued.
        shutil.rmtree(run_dir, ignore_errors=True)
        exc.message += f" (nothing was queued; {run_dir.name} was removed)"
        raise
    run.job_id = job_id
    run.submitted_at = utc_now_iso()
    if ";" in job_id:
        run.cluster = job_id.split(";", 1)[1]
    elif backend_obj.name == "local":
        run.cluster = "local"
    elif isinstance(backend_obj, SbatchBackend):
        run.cluster = backend_obj.cluster_name()
    write_run(run)
    return SubmitResult(run, script, backend_obj.name, plan=plan)


def submit_file(
    path: str | Path,
    overrides: Overrides | None = None,
    **kwargs: Any,
) -> SubmitResult:
    """``hetrun submit JOB.yaml``: load (with overrides), plan, submit."""
    from hetrun.dag.spec import load_spec

    spec = load_spec(path, overrides)
    kwargs.setdefault("job_dir", Path(path).parent)
    kwargs.setdefault("job_file", str(path))
    return submit_spec(spec, **kwargs)


def backend_for(run: RunInfo) -> Backend:
    """The backend a run was submitted with."""
    return get_backend(resolve_name(run.backend))


def is_finished(status: RunStatus) -> bool:
    return bool(status.components) and all(
        c.state not in ACTIVE_STATES and c.state != "NOT_SUBMITTED" for c in status.components
    )


def wait_for_end(
    run: RunInfo,
    backend: Backend,
    *,
    timeout_s: float | None = None,
    poll_s: float = 2.0,
    on_change: Callable[[RunStatus], None] | None = None,
) -> RunStatus:
    """Poll until every component has ended; ``on_change`` sees each new state."""
    seen: list[RunStatus] = []

    def ended() -> RunStatus | None:
        status = backend.status([run])[run.run_dir]
        states = [c.state for c in status.components]
        if on_change is not None and (not seen or states != [c.state for c in seen[-1].components]):
            on_change(status)
        seen[:] = [status]
        return status if is_finished(status) else None

    final = poll_until(ended, Backoff(first=poll_s, most=poll_s, factor=1), timeout=timeout_s)
    if final is None:
        raise HetrunError(f"run {Path(run.run_dir).name} still {seen[-1].state} after {timeout_s:g}s",
                          hint="it keeps running; follow it with `hetrun status`")
    return final

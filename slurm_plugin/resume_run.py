"""`hetrun resume RUN` and `hetrun resubmit RUN --resize`: continue a run as a new attempt.

The new job runs in the SAME run directory (events.jsonl, ckpt/, logs/), so
the runtime restores the newest checkpoint every component can load, and the
reports see one run with one more attempt. Its first attempt's restart count
is one past the newest the run has seen (``env.HETRUN_RESTART_BASE``, which
the batch script adds to ``SLURM_RESTART_COUNT`` and the local supervisor
starts from), so attempts, work lost and budgets count on. An old attempt
that left no ``attempt_end`` (its job was killed before its post-mortem ran)
gets one here, with the state the backend reports.

Overrides may change what does not break the checkpoint (iterations, time,
partition, memory, ...); what the stored state depends on (workload and its
args, seed, components and their actions, pipeline shape, checkpoint
location and encoding) is refused. Rank counts change only with ``resize``,
restored by ``hetrun.runtime.resize``'s rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrun.dag.rank_layout import layout_sets

from hetrun.errors import RunDirError, SpecError
from hetrun.planfile import read_plan
from hetrun.rundir import RunPaths

from .backends import get_backend, resolve_name
from .backends.base import ACTIVE_STATES
from .backends.local import STATE_FILE
from .render import render_sbatch
from .rundir import (
    JOB_YAML,
    LOGS,
    PLAN_JSON,
    RESTART_BASE_ENV,
    SCRIPT,
    RunInfo,
    append_event,
    events_of,
    utc_now_iso,
    write_atomic,
    write_run,
)
from .submit import check_visible_to_nodes, plan_for

if TYPE_CHECKING:
    from hetrun.dag.overrides import Overrides
    from hetrun.dag.plan import Plan
    from hetrun.dag.spec import JobSpec

# Parts of the spec the stored state depends on: a resume may not change them.
_FIXED = ("name", "workload", "workload_args", "training.kind", "training.micro_batches",
          "training.pipeline_window", "training.seed", "training.mode", "checkpoint.directory",
          "checkpoint.optimizer_encoding", "comms")
# Backend states -> attempt_end outcomes, for an attempt that ended without one.
_OUTCOME = {"COMPLETED": "done", "CANCELLED": "cancelled", "TIMEOUT": "time_limit", "PREEMPTED": "preempted"}


@dataclass
class ResumePlan:
    """What a resume will submit (a dry run stops here)."""

    run: RunInfo
    restart: int  # restart count of the new job's first attempt
    spec: JobSpec
    plan: Plan
    script: str
    backend: str
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # component -> (old ranks, new ranks)

    @property
    def resized(self) -> dict[str, tuple[int, int]]:
        return {c: s for c, s in self.sizes.items() if s[0] != s[1]}


def last_restart(run_dir: Path) -> int | None:
    """The newest restart count the run's events mention (None: it never started)."""
    counts = [e["restart_count"] for e in events_of(run_dir, ("start", "restore", "attempt_end"))
              if isinstance(e.get("restart_count"), int) and not isinstance(e.get("restart_count"), bool)]
    return max(counts) if counts else None


def resize_sets(sizes: dict[str, int], spec: JobSpec) -> list[str]:
    """``--set`` overrides giving each component its rank count (``tune``'s form)."""
    out = []
    for name, ranks in sizes.items():
        if name not in spec.components:
            raise SpecError(f"--resize names component {name!r}, which the run does not have",
                            key_path=f"components.{name}", value=name,
                            hint="components: " + ", ".join(spec.components))
        if ranks < 1:
            raise SpecError(f"--resize {name}={ranks}: a component needs at least 1 rank",
                            key_path=f"components.{name}", value=ranks)
        out += layout_sets(name, ranks, spec.components[name].tasks_per_node)
    return out


def parse_resize(text: str) -> dict[str, int]:
    """``learner=1,rollout=3`` -> {"learner": 1, "rollout": 3}."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, num = part.partition("=")
        if not sep or not num.strip().isdigit() or not name.strip():
            raise SpecError(f"--resize {text!r}: {part!r} is not COMPONENT=RANKS",
                            hint="e.g. --resize rollout=3 or --resize learner=1,rollout=3, or --resize auto")
        out[name.strip()] = int(num)
    if not out:
        raise SpecError("--resize needs COMPONENT=RANKS[,...] or auto")
    return out


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def check_compatible(old: JobSpec, new: JobSpec) -> None:
    """Refuse overrides the run's checkpoints cannot survive."""
    a, b = json.loads(old.model_dump_json()), json.loads(new.model_dump_json())
    for key in _FIXED:
        if _get(a, key) != _get(b, key):
            raise SpecError(f"a resume cannot change {key} ({_get(a, key)!r} -> {_get(b, key)!r}): "
                            "the run's checkpoints hold state that depends on it",
                            key_path=key, value=_get(b, key),
                            hint="submit a new run instead (hetrun submit JOB.yaml)")
    for name, comp in a["components"].items():
        other = b["components"].get(name) or {}
        for key in ("actions", "command"):
            if comp.get(key) != other.get(key):
                raise SpecError(f"a resume cannot change components.{name}.{key}",
                                key_path=f"components.{name}.{key}", value=other.get(key),
                                hint="submit a new run instead (hetrun submit JOB.yaml)")


def prepare(run: RunInfo, overrides: Overrides | None = None, *, resize: dict[str, int] | None = None,
            backend: str | None = None) -> ResumePlan:
    """Check the run can continue and render what the new job will run; writes nothing."""
    from hetrun.dag.overrides import Overrides
    from hetrun.dag.spec import load_spec

    run_dir = run.path
    backend_obj = get_backend(resolve_name(backend or run.backend))
    old = load_spec(run_dir / JOB_YAML, check_args=False)
    restart = (last_restart(run_dir) or 0) + 1
    ov = overrides if overrides is not None else Overrides()
    sets = [*ov.sets, *(resize_sets(resize, old) if resize else []), f"env.{RESTART_BASE_ENV}={restart}"]
    new = load_spec(run_dir / JOB_YAML, replace(ov, sets=sets), check_args=False)
    check_compatible(old, new)
    old_plan = read_plan(run_dir)
    plan = plan_for(new, backend_obj.name)
    if old_plan.job_dir:
        plan = plan.model_copy(update={"job_dir": old_plan.job_dir})
    before = {c.name: c.ntasks for c in old_plan.action_components}
    after = {c.name: c.ntasks for c in plan.action_components}
    sizes = {c: (before.get(c, 0), n) for c, n in after.items()}
    changed = [c for c, (x, y) in sizes.items() if x != y]
    if changed and not resize:
        raise SpecError(f"these overrides change the rank count of {', '.join(changed)}",
                        hint="use `hetrun resubmit RUN --resize COMPONENT=N` to restore into other rank counts")
    if backend_obj.name != "local":
        check_visible_to_nodes(new, run_dir.parent, Path(old_plan.job_dir) if old_plan.job_dir else None)
    # placement: auto components are placed again against the pool of now (the one the old
    # attempt chose may be busy, or the sizes changed), as `hetrun submit` places them.
    from .placement_fit import place

    plan = place(new, plan, backend_obj)
    script = render_sbatch(plan, new, run_dir)
    return ResumePlan(run, restart, new, plan, script, backend_obj.name, sizes)


def _close_open_attempt(run: RunInfo, restart: int | None) -> dict[str, Any] | None:
    """An ``attempt_end`` for the run's newest attempt if it has none (killed before its post-mortem)."""
    if restart is None or any(e.get("restart_count") == restart for e in events_of(run.path, ("attempt_end",))):
        return None
    states = [c.state for c in get_backend(resolve_name(run.backend)).status([run])[run.run_dir].components]
    state = states[0] if states and len(set(states)) == 1 else ",".join(states) or "UNKNOWN"
    return append_event(run.path, "attempt_end", restart_count=restart, outcome=_OUTCOME.get(state, "failed"),
                        requeued=False, exit_code=None, launcher="hetrun resume", signal=None, failed_ranks=[],
                        reason=f"the job ended ({state}) without recording how; written by hetrun resume")


def ensure_ended(run: RunInfo) -> None:
    status = get_backend(resolve_name(run.backend)).status([run])[run.run_dir]
    active = [c for c in status.components if c.state in ACTIVE_STATES]
    if active:
        raise RunDirError(f"run {run.path.name} is still {active[0].state} (job {run.job_id})",
                          hint="cancel it first (hetrun cancel RUN) or wait until it ends")


def keep_replaced_plan(run_dir: Path, restart: int) -> None:
    """The plan the earlier attempts ran with, as ``logs/plan-before-attempt-<restart>.json``: its
    placement may differ from the new one, and `hetrun report` shows each (runtime/report_placement).
    An archive already there stays: a previous resume whose submit failed wrote it, and plan.json
    now holds that resume's plan, which no attempt ran with."""
    old, kept = run_dir / PLAN_JSON, RunPaths(run_dir).plan_before_attempt(restart)
    if old.exists() and not kept.exists():
        (run_dir / LOGS).mkdir(exist_ok=True)
        write_atomic(kept, old.read_text())


def submit(rp: ResumePlan) -> RunInfo:
    """Write the new spec, plan and script into the run directory and submit the next job."""
    run = rp.run
    ensure_ended(run)
    closed = _close_open_attempt(run, last_restart(run.path))
    write_atomic(run.path / JOB_YAML, rp.spec.to_yaml())
    keep_replaced_plan(run.path, rp.restart)
    write_atomic(run.path / PLAN_JSON, rp.plan.to_json())
    write_atomic(run.path / SCRIPT, rp.script)
    (run.path / SCRIPT).chmod(0o755)
    append_event(run.path, "resume", restart_count=rp.restart, previous_job=run.job_id,
                 closed_attempt=closed is not None, backend=rp.backend,
                 resize={c: list(s) for c, s in rp.resized.items()})
    if run.job_id:
        run.extra["previous_jobs"] = [*run.extra.get("previous_jobs", []), run.job_id]
    run.backend = rp.backend
    # every component, command ones too, as submit records them (plan_components lists one kind)
    run.components = [c.name for c in rp.plan.components]
    run.pids = {}
    stale = run.path / STATE_FILE  # the old local supervisor's record: its final state is not the new job's
    if stale.exists():
        stale.replace(run.path / LOGS / f"local-before-attempt-{rp.restart}.json")
    backend_obj = get_backend(rp.backend)
    run.job_id = backend_obj.submit(run)
    run.submitted_at = utc_now_iso()
    if rp.backend == "local":
        run.cluster = "local"
    write_run(run)
    return run

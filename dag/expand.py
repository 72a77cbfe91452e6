"""Expand a job spec into the coarse per-iteration action template.

RL (``training.kind: rl``)::

    rollout --> forward --> backward --> sync.grads --> optimize --> sync.policy
       ^                                                                 |
       +---------- lag 1 + tolerance_window (stale weights allowed) -----+

Supervised: forward --> backward --> sync.grads --> optimize. Both add
``checkpoint`` and ``eval`` after optimize on their own cadence (``every``),
and ``forward`` of iteration i waits for ``optimize`` of i-1 (lag 1). When eval
runs on another component than optimize, weights reach it through
``sync.policy`` too; on a component that rolls out it reads the version that
iteration's rollout loaded (``_eval_dep``). The compiler (``dag.compile``) then
splits, orders and fuses this template.
"""

from __future__ import annotations

import itertools

from hetrun.dag.action import ActionGraph, Dep, ResourceProfile, TrainingAction
from hetrun.dag.spec import ActionOverride, ComponentSpec, JobSpec
from hetrun.dag.validators import mem_to_mb

from hetrun.errors import GraphError

# Defaults a spec's `actions:` section overrides.
DEFAULT_QOS = {"checkpoint": "high", "eval": "low"}

# Share of a rank's memory budget each action type holds by default. forward
# is per micro-batch: the whole batch's activations take half the budget.
_MEMORY_SHARE = {
    "rollout": 0.5,
    "forward": 0.5,  # divided by micro_batches
    "backward": 0.5,  # same activations, freed at its end
    "sync": 0.125,
    "optimize": 0.25,  # model state: parameters, gradients, optimizer moments
    "checkpoint": 0.125,
    "eval": 0.25,
}


def _profile(action_type: str, comp: ComponentSpec, override: ActionOverride | None, micro_batches: int) -> ResourceProfile:
    share = _MEMORY_SHARE[action_type]
    if action_type in ("forward", "backward"):
        share /= micro_batches
    gpu_budget = comp.gpu_mem_per_task_mb or 0
    prof = ResourceProfile(
        cpu=comp.cpus_per_task,
        gpu=comp.gpus_per_task,
        memory_mb=max(1, int(comp.mem_per_task_mb * share)),
        gpu_memory_mb=int(gpu_budget * share),
    )
    if override is not None:
        if override.cpu is not None:
            prof.cpu = override.cpu
        if override.gpu is not None:
            prof.gpu = override.gpu
        if override.memory is not None:
            prof.memory_mb = mem_to_mb(override.memory)
        if override.gpu_memory is not None:
            prof.gpu_memory_mb = mem_to_mb(override.gpu_memory)
    return prof


def expand(spec: JobSpec) -> ActionGraph:
    """The coarse per-iteration template of ``spec`` (forward/backward not yet split)."""
    training = spec.training
    coarse = training.mode == "coarse"
    graph = ActionGraph()

    def make(action_id: str, action_type: str, deps: list[Dep], every: int = 1,
             component: str | None = None) -> TrainingAction:
        override = spec.actions.get(action_type)
        cname = component or spec.component_of(action_type)
        comp = spec.components[cname]
        tw = override.tolerance_window if override and override.tolerance_window is not None else 0
        qos = override.qos if override and override.qos else DEFAULT_QOS.get(action_type, "normal")
        return graph.add(TrainingAction(
            id=action_id, action_type=action_type, component=cname,
            resource_profile=_profile(action_type, comp, override, training.micro_batches),
            deps=deps, tolerance_window=0 if coarse else tw, qos=qos, every=every,
        ))

    learner = spec.component_of("optimize")
    eval_elsewhere = training.eval_interval > 0 and spec.component_of("eval") != learner
    if training.kind == "rl":
        rollout_tw = 0 if coarse else _tolerance(spec, "rollout")
        # Rollout i needs the weights optimize(i-1) produced; a tolerance window
        # of w lets it run on weights w versions older, so it need not wait.
        make("rollout", "rollout", [Dep("sync.policy", 1 + rollout_tw)])
        make("forward", "forward", [Dep("rollout", 0), Dep("optimize", 1)])
    else:
        make("forward", "forward", [Dep("optimize", 1)])
    make("backward", "backward", [Dep("forward", 0)])
    make("sync.grads", "sync", [Dep("backward", 0)])
    make("optimize", "optimize", [Dep("sync.grads", 0)])
    if training.kind == "rl" or eval_elsewhere:
        every = 1 if training.kind == "rl" else training.eval_interval
        make("sync.policy", "sync", [Dep("optimize", 0)], every=every, component=learner)
    if spec.checkpoint.interval > 0:
        make("checkpoint", "checkpoint", [Dep("optimize", 0)], every=spec.checkpoint.interval)
    if training.eval_interval > 0:
        make("eval", "eval", [_eval_dep(spec, eval_elsewhere)], every=training.eval_interval)
    _add_user_deps(spec, graph)
    return graph


def _eval_dep(spec: JobSpec, eval_elsewhere: bool) -> Dep:
    """The weights eval reads.

    On a rank that also rolls out (RL, eval placed with rollout): the version that
    iteration's rollout loaded (the rollout's own dep, lag 1 + tolerance_window), so the
    evaluation waits for nothing the rollout did not, runs in the rank's wait for the next
    weights, and no training action waits for it. Elsewhere the newest weights (lag 0): on
    the learner they are at hand; a rank of its own holds no training action back. A lagged
    dep there would point at iterations where no sync ran (supervised sync.policy runs
    only every eval_interval); eval's tolerance window only lowers its priority.
    """
    if not eval_elsewhere:
        return Dep("optimize", 0)
    if spec.training.kind == "rl" and "rollout" in spec.components[spec.component_of("eval")].actions:
        coarse = spec.training.mode == "coarse"
        return Dep("sync.policy", 1 + (0 if coarse else _tolerance(spec, "rollout")))
    return Dep("sync.policy", 0)


def _tolerance(spec: JobSpec, action_type: str) -> int:
    override = spec.actions.get(action_type)
    return override.tolerance_window if override and override.tolerance_window is not None else 0


def _add_user_deps(spec: JobSpec, graph: ActionGraph) -> None:
    """``actions.<type>.after: [...]``: every action of that type waits for those types."""
    by_type: dict[str, list[str]] = {}
    for a in graph:
        by_type.setdefault(a.action_type, []).append(a.id)
    for action_type, override in spec.actions.items():
        for before in override.after:
            key = f"actions.{action_type}.after"
            if before == action_type:
                raise GraphError(f"dependency cycle: {action_type} -> {action_type}",
                                 hint=f"remove {before!r} from {key}", key_path=key)
            if before not in by_type:
                raise GraphError(f"{key} names {before!r}, which this job does not run",
                                 hint=_why_missing(before), key_path=key)
            for aid in by_type.get(action_type, []):
                action = graph[aid]
                for bid in by_type.get(before, []):
                    if bid != aid and all(d.id != bid or d.lag != 0 for d in action.deps):
                        action.deps.append(Dep(bid, 0, "user"))
    cycle = graph.find_cycle()
    if cycle:
        raise GraphError("dependency cycle: " + " -> ".join(cycle), key_path=_after_key(spec, graph, cycle),
                         hint="remove one of these deps from actions.<type>.after")


def _after_key(spec: JobSpec, graph: ActionGraph, cycle: list[str]) -> str | None:
    """The ``actions.<type>.after`` list that closes ``cycle`` (a depends on b ...)."""
    for a, b in itertools.pairwise(cycle):
        ta, tb = graph[a].action_type, graph[b].action_type
        override = spec.actions.get(ta)
        if override is not None and tb in override.after:
            return f"actions.{ta}.after"
    return None


def _why_missing(action_type: str) -> str:
    return {
        "eval": "set training.eval_interval above 0, or remove it from after",
        "checkpoint": "set checkpoint.interval above 0, or remove it from after",
        "rollout": "rollout runs only with training.kind: rl; remove it from after",
    }.get(action_type, "remove it from after")

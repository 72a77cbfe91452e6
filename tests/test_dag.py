"""Action graph, expansion, compiler passes, scheduler, packing, plan.json and unrolling."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from hetrun.dag.action import (
    ActionGraph,
    Dep,
    NodeCapacity,
    ResourceProfile,
    TrainingAction,
    split_id,
)
from hetrun.dag.expand import expand
from hetrun.dag.plan import Plan, build_plan, build_plan_explained
from hetrun.dag.schedule import Weights, check_fits_nodes
from hetrun.dag.spec import JobSpec, spec_from_dict
from hetrun.dag.unroll import schedule_order, unroll
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrun.errors import GraphError, RunDirError

RL: dict[str, Any] = {
    "name": "rl",
    "workload": "pkg.mod:Work",
    "components": {
        "learner": {"nodes": 1, "tasks_per_node": 2, "mem": "2G",
                    "actions": ["forward", "backward", "sync", "optimize", "checkpoint", "eval"]},
        "rollout": {"nodes": 3, "mem": "1G", "actions": ["rollout"]},
    },
    "training": {"kind": "rl", "iterations": 20, "micro_batches": 3, "pipeline_window": 2, "eval_interval": 5},
    "actions": {"rollout": {"tolerance_window": 1}},
    "checkpoint": {"interval": 10},
}

SUP: dict[str, Any] = {
    "name": "sup",
    "workload": "pkg.mod:Work",
    "components": {"learner": {"nodes": 2, "tasks_per_node": 2, "mem": "4G",
                               "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]},
                   "evaluator": {"nodes": 1, "mem": "1G", "actions": ["eval"]}},
    "training": {"kind": "supervised", "iterations": 10, "micro_batches": 4, "eval_interval": 2},
    "checkpoint": {"interval": 5},
}


def spec(base: dict[str, Any], **changes: Any) -> JobSpec:
    data = copy.deepcopy(base)
    for dotted, value in changes.items():
        node = data
        parts = dotted.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return spec_from_dict(data)


def action(aid: str, deps: list[Dep] | None = None, comp: str = "c", prio: float = 0.0) -> TrainingAction:
    a = TrainingAction(aid, split_id(aid)[0], comp, ResourceProfile(), deps or [])
    a.priority = prio
    return a


# -- graph -------------------------------------------------------------------------------------

def test_cycle_is_spelled_out() -> None:
    g = ActionGraph([action("forward", [Dep("optimize")]), action("backward", [Dep("forward")]),
                     action("optimize", [Dep("backward")])])
    with pytest.raises(GraphError) as info:
        g.validate()
    msg = str(info.value)
    assert "dependency cycle:" in msg
    cycle = msg.split("dependency cycle: ")[1].splitlines()[0].split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"forward", "backward", "optimize"}
    for a, b in itertools.pairwise(cycle):  # each step is a real dependency
        assert any(d.id == b for d in g[a].deps)


def test_lagged_edge_is_not_a_cycle() -> None:
    g = ActionGraph([action("forward", [Dep("optimize", 1)]), action("optimize", [Dep("forward")])])
    g.validate()
    assert g.topological_order() == ["forward", "optimize"]


def test_unknown_dep_and_duplicate_id() -> None:
    with pytest.raises(GraphError, match="unknown action 'nope'"):
        ActionGraph([action("forward", [Dep("nope")])]).validate()
    with pytest.raises(GraphError, match="defined twice"):
        ActionGraph([action("forward"), action("forward")])


def test_topological_order_uses_priority_for_ties() -> None:
    g = ActionGraph([action("a"), action("b", prio=0.9), action("c", [Dep("a")], prio=1.0),
                     action("d", [Dep("b"), Dep("c")])])
    assert g.topological_order() == ["b", "a", "c", "d"]


def test_split_id() -> None:
    assert split_id("forward.m12") == ("forward", None, 12)
    assert split_id("sync.grads") == ("sync", "grads", None)
    assert split_id("optimize") == ("optimize", None, None)


def test_user_after_creates_reported_cycle() -> None:
    s = spec(SUP, actions={"checkpoint": {"after": ["eval"]}},
             training__eval_interval=1, checkpoint__interval=1,
             components__evaluator__actions=["eval"])
    s2 = spec(SUP, actions={"checkpoint": {"after": ["eval"]}, "optimize": {"after": ["checkpoint"]}})
    build_plan(s)  # checkpoint after eval alone is fine
    with pytest.raises(GraphError, match=r"dependency cycle: .*optimize.*checkpoint"):
        build_plan(s2)


# -- expansion ---------------------------------------------------------------------------------

def test_rl_template() -> None:
    g = expand(spec(RL))
    assert g.ids() == ["rollout", "forward", "backward", "sync.grads", "optimize", "sync.policy",
                       "checkpoint", "eval"]
    # tolerance window 1: rollout of iteration i may use the weights of i-2's sync
    assert g["rollout"].deps == [Dep("sync.policy", 2)]
    assert g["rollout"].component == "rollout" and g["forward"].component == "learner"
    assert Dep("rollout", 0) in g["forward"].deps and Dep("optimize", 1) in g["forward"].deps
    assert g["checkpoint"].every == 10 and g["eval"].every == 5
    assert g["checkpoint"].qos == "high" and g["eval"].qos == "low"


def test_rl_without_tolerance_waits_for_previous_weights() -> None:
    g = expand(spec(RL, actions={}))
    assert g["rollout"].deps == [Dep("sync.policy", 1)]
    g = expand(spec(RL, training__mode="coarse"))
    assert g["rollout"].deps == [Dep("sync.policy", 1)] and g["rollout"].tolerance_window == 0


def test_supervised_template_with_remote_eval() -> None:
    g = expand(spec(SUP))
    assert "rollout" not in g
    assert g["forward"].deps == [Dep("optimize", 1)]
    # eval runs on another component, so weights travel there through sync.policy
    assert g["eval"].component == "evaluator" and g["eval"].deps == [Dep("sync.policy", 0)]
    assert g["sync.policy"].every == 2


def test_optional_actions_default_to_the_learner() -> None:
    s = spec(SUP, components={"learner": {"mem": "4G", "actions": ["forward", "backward", "optimize"]}},
             training__eval_interval=3)
    g = expand(s)
    assert g["sync.grads"].component == "learner" and g["eval"].component == "learner"
    plan = build_plan(s)
    assert plan.components[0].actions == ["forward", "backward", "sync", "optimize", "checkpoint", "eval"]


def test_resource_profiles_follow_the_component() -> None:
    s = spec(SUP, components__learner__cpus_per_task=4, components__learner__gpus_per_node=4,
             components__learner__gpu_mem="16G", actions={"forward": {"memory": "300M", "gpu_memory": "2G"}})
    g = expand(s)
    f = g["forward"].resource_profile
    assert (f.cpu, f.gpu, f.memory_mb, f.gpu_memory_mb) == (4, 2, 300, 2048)
    assert g["optimize"].resource_profile.gpu_memory_mb == 16384 * 4 // 2 // 4


# -- compiler passes ---------------------------------------------------------------------------

def test_split_pass_parts_run_in_parallel_and_merge_before_sync() -> None:
    build = build_plan_explained(spec(SUP, schedule={"max_inflight_micro": 4}))
    split = build.passes[0]
    assert "forward <- " in split.before[0] or any(line.startswith("forward ") for line in split.before)
    after = "\n".join(split.after)
    for j in range(4):
        assert f"forward.m{j} [learner] <- optimize@-1" in after
        assert f"backward.m{j} [learner] <- forward.m{j}" in after
    assert "sync.grads [learner] <- backward.m0, backward.m1, backward.m2, backward.m3" in after


def test_memory_pass_1f1b_lowers_peak() -> None:
    build = build_plan_explained(spec(SUP))
    mem = build.memory
    assert mem is not None and mem.inflight_before == 4 and mem.inflight_after == 1
    assert mem.peak_after_mb < mem.peak_before_mb
    assert mem.peak_before_mb == mem.model_state_mb + 4 * mem.activation_mb
    after = "\n".join(build.passes[1].after)
    for j in range(1, 4):
        assert f"forward.m{j} [learner] <- optimize@-1, backward.m{j - 1}" in after
    assert build.plan.memory is not None and build.plan.memory.peak_after_mb == mem.peak_after_mb


def test_memory_pass_lowers_inflight_to_what_fits() -> None:
    # budget 2048 MB per rank, model state 512 MB: 3 micro-batches of 500 MB fit, not 4.
    s = spec(SUP, components__learner__mem="4G", actions={"forward": {"memory": "500M"}},
             schedule={"max_inflight_micro": 4})
    build = build_plan_explained(s)
    assert build.memory is not None and build.memory.inflight_after == 3
    assert any("lowered to 3" in n for n in build.passes[1].notes)
    assert build.memory.peak_after_mb <= build.memory.budget_mb  # type: ignore[operator]


def test_memory_pass_rejects_one_microbatch_that_cannot_fit() -> None:
    s = spec(SUP, actions={"forward": {"memory": "1900M"}})
    with pytest.raises(GraphError, match="exceed the 2048 MB of memory per rank"):
        build_plan(s)


def test_fuse_pass_merges_single_consumer_chains() -> None:
    build = build_plan_explained(spec(RL))
    ids = [a.id for a in build.plan.actions]
    assert "forward.m0+backward.m0" in ids and "sync.grads+optimize" in ids
    fused = {a.id: a.fused for a in build.plan.actions}
    assert fused["sync.grads+optimize"] == ["sync.grads", "optimize"]
    assert fused["rollout"] == []  # rollout feeds three forward parts: not fusable
    # checkpoint runs every 10 iterations, optimize every one: never fused together
    assert "checkpoint" in ids
    assert build.passes[2].summary.startswith(f"{len(build.passes[2].before)} actions -> {len(ids)} dispatches")


def test_fuse_keeps_components_apart() -> None:
    plan = build_plan(spec(RL))
    for a in plan.actions:
        members = a.members()
        assert all(plan.action(a.id).component == a.component for _ in members)
    rollout = plan.action("rollout")
    assert rollout.component == "rollout" and rollout.fused == []


# -- scheduler and packing ---------------------------------------------------------------------

def test_priorities_follow_weights() -> None:
    s = spec(RL)
    qos_only = {a.id: a.priority for a in build_plan(s, weights=Weights(1.0, 0.0)).actions}
    assert qos_only["checkpoint"] == 0.75  # high class, no tolerance
    assert qos_only["rollout"] == 0.25  # normal (0.5) halved by a tolerance window of 1
    assert qos_only["eval"] == 0.25
    default = {a.id: a.priority for a in build_plan(s).actions}
    util_only = {a.id: a.priority for a in build_plan(s, weights=(0.0, 1.0)).actions}
    for aid in default:
        assert default[aid] == pytest.approx(0.7 * qos_only[aid] + 0.3 * util_only[aid], abs=2e-4)


def test_schedule_weights_from_spec_change_order() -> None:
    s = spec(RL, schedule={"qos_weight": 0.0, "util_weight": 1.0})
    plan = build_plan(s)
    assert plan.schedule.qos_weight == 0.0
    order = plan.order
    # All three depend only on optimize; with utilization alone the lighter checkpoint goes last.
    tail = [a for a in order if a in ("checkpoint", "sync.policy", "eval")]
    pr = {a.id: a.priority for a in plan.actions}
    assert tail == sorted(tail, key=lambda a: -pr[a])


def test_order_is_topological() -> None:
    for s in (spec(RL), spec(SUP)):
        plan = build_plan(s)
        pos = {aid: i for i, aid in enumerate(plan.order)}
        for a in plan.actions:
            for d in a.deps:
                if d.lag == 0:
                    assert pos[d.id] < pos[a.id]


def test_packing_into_het_components() -> None:
    plan = build_plan(spec(SUP))
    learner, evaluator = plan.components
    assert (learner.name, learner.index, learner.nodes, learner.tasks_per_node, learner.ntasks) == ("learner", 0, 2, 2, 4)
    assert learner.mem_mb == 4096 and learner.cpus_per_task == 1 and learner.gpus_per_node == 0
    assert (evaluator.index, evaluator.ntasks, evaluator.actions) == (1, 1, ["eval"])


def test_action_bigger_than_its_rank_is_rejected() -> None:
    s = spec(SUP, actions={"eval": {"cpu": 8}})
    with pytest.raises(GraphError, match=r"'eval' cannot run on a rank of component 'evaluator': 8 CPUs"):
        build_plan(s)


def test_node_capacities_reject_unsatisfiable_component() -> None:
    caps = [NodeCapacity(f"n{i}", cpus=2, gpus=2, mem_mb=4000) for i in range(4)]
    build_plan(spec(SUP, components__learner__mem="3G"), capacities=caps)
    with pytest.raises(GraphError, match=r"component 'learner' needs 4096 MB per node \(max 4000\)"):
        build_plan(spec(SUP), capacities=caps)
    with pytest.raises(GraphError, match=r"8 GPUs per node \(max 2\)"):
        build_plan(spec(SUP, components__learner__mem="1G", components__learner__gpus_per_node=8), capacities=caps)
    with pytest.raises(GraphError, match=r"needs 5 nodes .* only 4 such nodes"):
        build_plan(spec(SUP, components__learner__mem="1G", components__learner__nodes=5), capacities=caps)
    s = spec(SUP, components__learner__mem="1G")
    g = expand(s)
    g["eval"].resource_profile.cpu = 3
    with pytest.raises(GraphError, match=r"action 'eval' needs 3 CPUs.*no node has that \(largest: n0"):
        check_fits_nodes(g, s, caps)


# -- plan.json ---------------------------------------------------------------------------------

def test_plan_json_round_trip_and_contract_shape() -> None:
    plan = build_plan(spec(RL))
    text = plan.to_json()
    assert Plan.from_json(text) == plan
    raw = json.loads(text)
    assert raw["version"] == 1
    for key in ("name", "workload", "workload_args", "training", "components", "actions", "order",
                "checkpoint", "preemption", "env", "comms", "slurm", "schedule"):
        assert key in raw
    comp = raw["components"][0]
    assert set(comp) == {"name", "index", "nodes", "tasks_per_node", "ntasks", "cpus_per_task",
                         "gpus_per_node", "mem_mb", "actions"}
    act = raw["actions"][1]
    assert {"id", "type", "component", "micro", "deps", "tolerance_window", "qos", "priority",
            "resource", "fused"} <= set(act)
    assert set(act["resource"]) == {"cpu", "gpu", "memory_mb", "gpu_memory_mb"}
    assert {"id", "lag"} <= set(act["deps"][0])


@pytest.mark.parametrize("mutate,match", [
    (lambda raw: "not json", "not valid JSON"),
    (lambda raw: [], "expected a JSON object"),
    (lambda raw: {**raw, "version": 99}, "plan version 99"),
    (lambda raw: {**raw, "order": raw["order"][:-1]}, "order does not list every action"),
    (lambda raw: {**raw, "actions": [{**raw["actions"][0], "component": "ghost"}, *raw["actions"][1:]]},
     "unknown component 'ghost'"),
    (lambda raw: {k: v for k, v in raw.items() if k != "components"}, "components"),
])
def test_plan_from_json_rejects_damaged_files(mutate: Any, match: str) -> None:
    raw = json.loads(build_plan(spec(RL)).to_json())
    bad = mutate(raw)
    text = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(RunDirError, match=match):
        Plan.from_json(text)


def test_plan_helpers() -> None:
    plan = build_plan(spec(RL))
    learner = plan.actions_of("learner")
    assert all(a.component == "learner" for a in learner)
    assert [a.id for a in learner] == [i for i in plan.order if plan.action(i).component == "learner"]
    ckpt = plan.action("checkpoint")
    assert ckpt.runs_at(9) and not ckpt.runs_at(10)
    assert plan.graph().ids() == [a.id for a in plan.actions]


# -- unrolling ---------------------------------------------------------------------------------

def test_unroll_component_level() -> None:
    plan = build_plan(spec(RL))
    g = unroll(plan, 3)
    names = [g.name(i) for i in range(len(g))]
    assert "i0/rollout" in names and "i2/sync.grads+optimize" in names
    assert "i0/eval" not in names and "i0/checkpoint" not in names  # every 5 / 10
    order = [g.name(i) for i in schedule_order(g, [a.priority for a in plan.actions])]
    pos = {n: i for i, n in enumerate(order)}
    assert pos["i0/sync.grads+optimize"] < pos["i1/forward.m0+backward.m0"]  # lag-1 weights dep
    # tolerance window 1 (lag 2): rollout of iteration 1 does not wait for iteration 0's sync
    preds = {g.name(n): [g.name(p) for p in ps] for n, ps in enumerate(g.predecessors())}
    assert preds["i1/rollout"] == [] and preds["i2/rollout"] == ["i0/sync.policy"]


def test_unroll_per_rank_maps_ranks() -> None:
    plan = build_plan(spec(RL))  # learner: 2 ranks, rollout: 3 ranks
    g = unroll(plan, 1, per_rank=True)
    per_tpl = {a.id: 2 if a.component == "learner" else 3 for a in plan.actions if a.runs_at(0)}
    assert len(g) == sum(per_tpl.values())
    preds = {g.name(n): [g.name(p) for p in ps] for n, ps in enumerate(g.predecessors())}
    # learner rank d consumes the rollout ranks p with p % 2 == d (the runtime's routing)
    assert sorted(preds["i0/forward.m0+backward.m0@r0"]) == ["i0/rollout@r0", "i0/rollout@r2"]
    assert sorted(preds["i0/forward.m0+backward.m0@r1"]) == ["i0/rollout@r1"]
    # and the other way: rollout rank d takes the weights from learner rank d % 2
    g3 = unroll(plan, 3, per_rank=True)
    preds3 = {g3.name(n): [g3.name(p) for p in ps] for n, ps in enumerate(g3.predecessors())}
    assert preds3["i2/rollout@r2"] == ["i0/sync.policy@r0"]
    assert preds3["i2/rollout@r1"] == ["i0/sync.policy@r1"]
    # same component: rank to rank
    assert preds["i0/sync.grads+optimize@r1"] == ["i0/forward.m0+backward.m0@r1", "i0/forward.m1+backward.m1@r1",
                                                  "i0/forward.m2+backward.m2@r1"]
    order = schedule_order(g, [a.priority for a in plan.actions])
    assert sorted(order) == list(range(len(g)))


def test_unroll_rejects_zero() -> None:
    with pytest.raises(GraphError):
        unroll(build_plan(spec(RL)), 0)


def test_user_after_must_name_an_action_that_runs() -> None:
    with pytest.raises(GraphError, match=r"actions.checkpoint.after names 'eval'.*\n.*eval_interval"):
        build_plan(spec(SUP, training__eval_interval=0, actions={"checkpoint": {"after": ["eval"]}}))
    with pytest.raises(GraphError, match="dependency cycle: eval -> eval"):
        build_plan(spec(SUP, actions={"eval": {"after": ["eval"]}}))


def test_dag_imports_no_torch_numpy_or_slurm() -> None:
    import subprocess
    import sys

    probe = ("import sys, hetrun.dag.plan, hetrun.dag.unroll, hetrun.dag.overrides\n"
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'mpi4py', 'pyslurm')"
             " or m.startswith('hetrun.slurm_plugin') or m.startswith('hetrun.runtime'))\n"
             "print('BAD=' + ','.join(bad))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().endswith("BAD="), proc.stdout + proc.stderr


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=25).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
    st.lists(st.floats(0, 1), min_size=n, max_size=n))))
def test_topological_order_is_greedy_by_priority(case: tuple[int, list[tuple[int, int]], list[float]]) -> None:
    n, edges, prios = case
    deps: dict[int, set[int]] = {i: set() for i in range(n)}
    for a, b in edges:
        if a < b:
            deps[b].add(a)  # edges only forward: a DAG
    g = ActionGraph(action(f"a{i}", [Dep(f"a{d}") for d in sorted(deps[i])], prio=prios[i]) for i in range(n))
    order = [int(x[1:]) for x in g.topological_order()]
    done: set[int] = set()
    for node in order:
        ready = [i for i in range(n) if i not in done and deps[i] <= done]
        assert node in ready
        best = max(ready, key=lambda i: (prios[i], -i))
        assert (prios[node], -node) == (prios[best], -best)
        done.add(node)
    assert len(order) == n


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2), st.integers(1, 3),
       st.sampled_from(["rl", "supervised"]), st.integers(1, 4))
def test_unrolled_schedule_is_topological(micro: int, learners: int, rollouts: int, tolerance: int,
                                          window: int, kind: str, inflight: int) -> None:
    changes: dict[str, Any] = {"training__micro_batches": micro, "training__pipeline_window": window,
                               "components__learner__nodes": learners,
                               "schedule": {"max_inflight_micro": inflight}}
    if kind == "rl":
        changes.update(components__rollout__nodes=rollouts, actions={"rollout": {"tolerance_window": tolerance}})
    s = spec(RL if kind == "rl" else SUP, **changes)
    plan = build_plan(s)
    for per_rank in (False, True):
        g = unroll(plan, window + 1, per_rank=per_rank)
        order = schedule_order(g, [a.priority for a in plan.actions])
        assert sorted(order) == list(range(len(g)))
        pos = {node: i for i, node in enumerate(order)}
        for node, preds in enumerate(g.predecessors()):
            assert len(preds) == g.indeg[node]
            for p in preds:
                assert pos[p] < pos[node]

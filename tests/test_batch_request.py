"""The typed submit request (slurm_plugin/batch_request.py): built once from the JobSpec and the
placed Plan, its values the spec's own; ranges are the spec's fields' alone, strings pass quoting's gate.

Cheap: no Slurm, no run; real specs and plans from the planner."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.plan import PlacementChoice, build_plan
from hetrun.dag.spec import JobSpec, spec_from_dict
from hetrun.slurm_plugin.batch_request import BatchRequest, build_request
from hetrun.slurm_plugin.render import render_sbatch, write_sbatch

from hetrun.errors import SpecError
from hetrun.rundir import GRACE_SECONDS_RANGE, RESTART_BASE_ENV

RUN_DIR = Path("/var/tmp/hetrun-request/RUN")


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "req",
        "workload": "hetrun.examples.ppo:PPOWorkload",
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 2, "mem": "2G",
                        "actions": ["forward", "backward", "optimize", "sync"]},
            "rollout": {"nodes": 2, "tasks_per_node": 1, "mem": "1G", "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": 2},
        "slurm": {"partition": "debug", "account": "proj1", "time": "00:10:00",
                  "extra": ["--mail-type=END", "--exclusive"]},
        "preemption": {"signal": "USR1", "grace_seconds": 45, "max_preemptions": 3, "max_failures": 1},
        "env": {"B": "2", "A": "1"},
    }
    doc.update(changes)
    return doc


def _spec(**changes: Any) -> JobSpec:
    return spec_from_dict(_doc(**changes))


def test_the_request_holds_the_specs_values_typed_and_frozen() -> None:
    spec = _spec()
    req = build_request(spec, build_plan(spec))
    assert isinstance(req, BatchRequest) and req.name == "req"
    learner, rollout = req.components
    assert (learner.name, learner.nodes, learner.tasks_per_node, learner.gpus_per_node, learner.mem_mb) == \
        ("learner", 1, 2, 2, 2048)
    assert (rollout.name, rollout.nodes, rollout.mem_mb, rollout.command, rollout.partition) == \
        ("rollout", 2, 1024, None, "debug")  # not placed: the job's partition
    o = req.options
    assert (o.partition, o.account, o.qos, o.time, o.signal, o.grace_seconds) == \
        ("debug", "proj1", None, "00:10:00", "USR1", 45)
    assert o.extra_job == ("--mail-type=END",) and o.extra_component == ("--exclusive",)
    assert (o.budgets.max_preemptions, o.budgets.max_failures) == (3, 1)
    assert req.env == (("A", "1"), ("B", "2"))  # sorted: the script never depends on dict order
    assert req.restart_base == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.name = "other"  # type: ignore[misc]


def test_render_writes_out_the_request_and_nothing_else() -> None:
    spec = _spec(env={"A": "1", RESTART_BASE_ENV: "4"})
    plan = build_plan(spec)
    req = build_request(spec, plan)
    assert req.restart_base == 4  # hetrun resume's base, from the job's environment
    script = write_sbatch(req, RUN_DIR, python="/usr/bin/python3", hetrun_python="/usr/bin/python3")
    assert script == render_sbatch(plan, spec, RUN_DIR, python="/usr/bin/python3", hetrun_python="/usr/bin/python3")
    assert "#SBATCH --signal=B:USR1@45" in script and "+ 4 ))" in script
    # A request changed after it was built is what is written: render reads no spec or plan.
    other = dataclasses.replace(req, options=dataclasses.replace(req.options, grace_seconds=7))
    assert "#SBATCH --signal=B:USR1@7" in write_sbatch(other, RUN_DIR, python="/usr/bin/python3",
                                                       hetrun_python="/usr/bin/python3")


def test_the_placement_choice_is_the_components_partition_and_gpu_type() -> None:
    spec = _spec()
    plan = build_plan(spec)
    learner = plan.components[0]
    placed = plan.model_copy(update={"components": [
        learner.model_copy(update={"placement": PlacementChoice(partition="high", gres="gpu:a100", score=1.0)}),
        plan.components[1].model_copy(update={"placement": PlacementChoice(
            partition="high", gres="-", score=1.0, ranked=["high", "debug"])}),
    ]})
    first, second = build_request(spec, placed).components
    assert (first.partition, first.gpu_type) == ("high", "a100")
    assert (second.partition, second.gpu_type) == ("high,debug", None)


@pytest.mark.parametrize("grace", [GRACE_SECONDS_RANGE[0], GRACE_SECONDS_RANGE[1]])
def test_the_specs_grace_range_renders_at_both_ends(grace: int) -> None:
    spec = _spec(preemption={"grace_seconds": grace}, slurm={"partition": "debug"})  # no time limit to be under
    assert build_request(spec, build_plan(spec)).options.grace_seconds == grace


@pytest.mark.parametrize("grace", [GRACE_SECONDS_RANGE[0] - 1, GRACE_SECONDS_RANGE[1] + 1])
def test_outside_the_range_the_spec_refuses_it_with_the_key_path(grace: int) -> None:
    with pytest.raises(SpecError) as info:
        _spec(preemption={"grace_seconds": grace}, slurm={"partition": "debug"})
    assert info.value.key_path == "preemption.grace_seconds"


def test_a_string_that_bypassed_the_spec_is_refused_naming_its_key() -> None:
    spec = _spec()
    plan = build_plan(spec)
    bypass = spec.model_copy(update={"env": {"OK": "1", "BAD": "x\ny"}})
    with pytest.raises(SpecError) as info:
        build_request(bypass, plan)
    assert info.value.key_path == "env.BAD"
    choice = PlacementChoice.model_construct(partition="a\n#SBATCH --wrap=id", gres="-", score=0.0, ranked=[])
    bad = plan.model_copy(update={"components": [plan.components[0].model_copy(update={"placement": choice}),
                                                 plan.components[1]]})
    with pytest.raises(SpecError) as info:
        build_request(spec, bad)
    assert info.value.key_path == "components.learner.placement.partition"

"""Pure parts of the runtime: component detection, routing, lags, message packing, plan view."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hetrun.runtime.comms.p2p import pack, unpack
from hetrun.runtime.executor import effective_lag, fed_ranks, feeding_ranks, sub_actions
from hetrun.runtime.plan_view import load_plan, plan_from_dict
from hetrun.runtime.world import collective_timeout_s, detect_component
from runtime_toy import toy_plan

from hetrun.errors import RunDirError, RuntimeFailure


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    return plan_from_dict(toy_plan(learners=2, rollouts=3))


def test_component_from_local_backend_env(plan) -> None:  # type: ignore[no-untyped-def]
    comp, _ = detect_component({"HETRUN_COMPONENT": "rollout"}, plan, 3, 5)
    assert comp.name == "rollout"
    comp, _ = detect_component({"HETRUN_COMPONENT": "0"}, plan, 0, 5)
    assert comp.name == "learner"
    with pytest.raises(RunDirError, match="no component 'rollot'"):
        detect_component({"HETRUN_COMPONENT": "rollot"}, plan, 0, 5)


def test_component_from_slurm_het_groups(plan) -> None:  # type: ignore[no-untyped-def]
    # srun over het groups 0,1: global ranks are numbered group after group.
    env = {"SLURM_HET_SIZE": "2", "SLURM_NTASKS_HET_GROUP_0": "2", "SLURM_NTASKS_HET_GROUP_1": "3"}
    names = [detect_component({**env, "SLURM_PROCID": str(r)}, plan, r, 5)[0].name for r in range(5)]
    assert names == ["learner", "learner", "rollout", "rollout", "rollout"]
    # Without per-group counts in the env, the plan's ntasks give the ranges.
    names = [detect_component({"SLURM_HET_SIZE": "2", "SLURM_PROCID": str(r)}, plan, r, 5)[0].name
             for r in range(5)]
    assert names == ["learner", "learner", "rollout", "rollout", "rollout"]
    with pytest.raises(RuntimeFailure, match="outside the het groups"):
        detect_component({**env, "SLURM_PROCID": "7"}, plan, 7, 8)


def test_no_component_evidence_is_a_clear_error(plan) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeFailure, match="HETRUN_COMPONENT nor SLURM_HET_SIZE"):
        detect_component({}, plan, 0, 5)


def test_collective_timeout_from_env(plan) -> None:  # type: ignore[no-untyped-def]
    assert collective_timeout_s(plan, {}) == 120.0
    assert collective_timeout_s(plan, {"HETRUN_COLLECTIVE_TIMEOUT": "7.5"}) == 7.5
    with pytest.raises(RuntimeFailure, match="not a number"):
        collective_timeout_s(plan, {"HETRUN_COLLECTIVE_TIMEOUT": "soon"})


def test_rollout_feeding_covers_every_learner() -> None:
    for n_src in range(1, 6):
        for n_dst in range(1, 6):
            feeds = [feeding_ranks(n_src, n_dst, d) for d in range(n_dst)]
            assert all(feeds), (n_src, n_dst)
            # every producer's batch goes somewhere, and fed_ranks is the inverse map
            for s in range(n_src):
                assert fed_ranks(n_src, n_dst, s) == [d for d in range(n_dst) if s in feeds[d]]
            assert {s for f in feeds for s in f} == set(range(n_src))


def test_lags_pipelined_and_coarse() -> None:
    piped = plan_from_dict(toy_plan(pipeline_window=2, tolerance=1))
    coarse = plan_from_dict(toy_plan(mode="coarse"))
    capped = plan_from_dict(toy_plan(pipeline_window=1, tolerance=3))
    for p, want in ((piped, 2), (coarse, 1), (capped, 2)):
        roll = p.action("rollout")
        dep = roll.deps[0]
        assert effective_lag(p, roll, dep, p.action(dep.id)) == want
    fwd = next(a for a in piped.actions if a.type == "forward")
    same = next(d for d in fwd.deps if d.lag == 1)  # its own optimize, one iteration back
    assert effective_lag(piped, fwd, same, piped.action(same.id)) == 1


def test_fused_actions_run_their_parts_in_order(plan) -> None:  # type: ignore[no-untyped-def]
    fused = next(a for a in plan.actions if a.fused)
    parts = sub_actions(plan, fused)
    assert [p[0] for p in parts] == list(fused.fused)
    assert parts[0][1] == "forward" and parts[1][1] == "backward" and parts[0][2] == fused.micro


def test_pack_round_trip_without_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    # Any use of pickle (or torch.save/load, which pickle) on either side fails the test.
    import pickle

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("tensor messages must not pickle")

    for owner, names in ((pickle, ("dumps", "loads", "dump", "load", "Pickler", "Unpickler")),
                         (torch, ("save", "load"))):
        for name in names:
            monkeypatch.setattr(owner, name, refuse)
    tensors = {"obs": torch.randn(5, 3), "act": torch.arange(5), "done": torch.tensor([True, False]),
               "scalar": torch.tensor(2.5, dtype=torch.float64), "empty": torch.zeros(0, 4),
               "half": torch.ones(3, dtype=torch.bfloat16)}
    buf = pack("data", "rollout", 7, tensors, {"steps": 5})
    msg = unpack(np.array(buf), source=3)
    assert (msg.kind, msg.producer, msg.iteration, msg.source, msg.meta) == ("data", "rollout", 7, 3,
                                                                            {"steps": 5})
    for k, t in tensors.items():
        assert msg.tensors[k].dtype == t.dtype and torch.equal(msg.tensors[k], t), k
    assert msg.nbytes == buf.size


def test_pack_rejects_non_tensors() -> None:
    with pytest.raises(RuntimeFailure, match="'x' of 'rollout' is a list"):
        pack("data", "rollout", 0, {"x": [1, 2]})  # type: ignore[dict-item]


def test_plan_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(RunDirError, match=r"plan\.json:1:2: not valid JSON"):
        load_plan(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps({"version": 9, "components": []}))
    with pytest.raises(RunDirError, match=r"version 9\b"):
        load_plan(tmp_path)


def test_workload_reference_is_checked() -> None:
    from hetrun.runtime.workload import load_workload_class

    from hetrun.errors import SpecError

    with pytest.raises(SpecError, match="is not module:Class"):
        load_workload_class("os.system('x'):Y")
    with pytest.raises(RuntimeFailure, match="cannot be imported"):
        load_workload_class("no_such_module_hetrun:Thing")


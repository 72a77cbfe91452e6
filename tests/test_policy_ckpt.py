"""``scheduling.checkpointed``: preemption by work lost through Slurm's own QOS (no cluster).

Slurm 22.05's preempt/qos sorts preemption candidates by (QOS Priority << 16) + node count,
lowest first, and gives a selected job its QOS GraceTime between SIGTERM and SIGKILL. The
policy renders, per tier, a ``<tier>_ckpt`` QOS just below the tier for jobs that checkpoint
and stop at an agreed step: these tests check the rendered objects, the sacctmgr commands,
the live read-back (GraceTime), the job_submit.lua mapping and the refusals."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hetrun.slurm_plugin.policy.desired import desired_state
from hetrun.slurm_plugin.policy.lua import policy_table, render_job_submit_lua
from hetrun.slurm_plugin.policy.model import validate_policy_data
from hetrun.slurm_plugin.policy.plan import make_plan
from hetrun.slurm_plugin.policy.state import LiveState, parse_qos

from hetrun.errors import SpecError

POLICY = """\
resources:
  gpu:
    type: [a100, v100]
    count: 96
    scheduling:
      priority: [critical, high, normal]
      preemption: true
      checkpointed: {grace_time: 45}
naming: {qos_prefix: pool_}
accounts:
  team:
    tiers: [high, normal]
    users: [alice]
"""


def _policy(text: str = POLICY):
    return validate_policy_data(yaml.safe_load(text))


def _slurm_preempt_order(qos: dict, jobs: list[tuple[str, str, int]]) -> list[str]:
    """preempt/qos's candidate order (src/plugins/preempt/qos, _gen_job_prio + _sort_by_prio)."""
    return [name for name, q, nodes in sorted(jobs, key=lambda j: (qos[j[1]].priority << 16) + j[2])]


def test_each_tier_gets_a_ckpt_qos_just_below_it_with_the_grace_time() -> None:
    qos = desired_state(_policy()).qos
    prio = {name: q.priority for name, q in qos.items()}
    assert prio == {"pool_critical": 3000, "pool_critical_ckpt": 2900, "pool_high": 2000,
                    "pool_high_ckpt": 1900, "pool_normal": 1000, "pool_normal_ckpt": 900}
    assert {name: q.grace_time for name, q in qos.items()} == {
        "pool_critical": 0, "pool_critical_ckpt": 45, "pool_high": 0, "pool_high_ckpt": 45,
        "pool_normal": 0, "pool_normal_ckpt": 0 + 45}
    # a tier and its _ckpt QOS preempt the same: every lower tier, plain and checkpointing
    assert qos["pool_critical"].preempt == qos["pool_critical_ckpt"].preempt == (
        "pool_high", "pool_high_ckpt", "pool_normal", "pool_normal_ckpt")
    assert qos["pool_normal"].preempt == qos["pool_normal_ckpt"].preempt == ()
    assert all(q.preempt_mode == "requeue" for q in qos.values())


def test_slurm_takes_checkpointing_jobs_first_whatever_their_size() -> None:
    qos = desired_state(_policy()).qos
    running = [("plain-normal-1node", "pool_normal", 1), ("ckpt-normal-16nodes", "pool_normal_ckpt", 16),
               ("ckpt-high-1node", "pool_high_ckpt", 1), ("plain-high-1node", "pool_high", 1)]
    assert _slurm_preempt_order(qos, running) == [
        "ckpt-normal-16nodes", "plain-normal-1node", "ckpt-high-1node", "plain-high-1node"]


def test_accounts_may_use_the_ckpt_qos_of_their_tiers_only() -> None:
    assocs = desired_state(_policy()).assocs
    assert assocs[("team", "")].qos == ("pool_high", "pool_high_ckpt", "pool_normal", "pool_normal_ckpt")
    assert assocs[("team", "alice")].qos == assocs[("team", "")].qos
    assert assocs[("team", "")].default_qos == "pool_normal"


def test_plan_adds_grace_time_and_reads_it_back() -> None:
    policy = _policy()
    desired = desired_state(policy)
    empty = LiveState({}, {}, {}, {})
    plan = make_plan(desired, empty, render_job_submit_lua(policy), None)
    adds = [" ".join(c) for ch in plan.by_kind("qos") for c in ch.commands]
    ckpt = next(c for c in adds if "name=pool_normal_ckpt" in c or " pool_normal_ckpt " in c)
    assert "GraceTime=45" in ckpt and "Priority=900" in ckpt
    assert not any("GraceTime" in c for c in adds if "_ckpt" not in c)
    # sacctmgr -n -P show qos format=...,GraceTime after apply (Slurm 22.05 prints H:M:S)
    live_text = "\n".join(
        f"{q.name}|{q.priority}|{','.join(q.preempt)}|{q.preempt_mode}||||DenyOnLimit|"
        f"00:00:{q.grace_time:02d}" for q in desired.qos.values())
    live = parse_qos(live_text)
    assert live == desired.qos
    # a QOS read with the old 8-field format still parses (grace 0)
    assert parse_qos("pool_high|2000|pool_normal|requeue||||DenyOnLimit")["pool_high"].grace_time == 0


def test_job_submit_lua_maps_the_ckpt_tiers() -> None:
    table = policy_table(_policy())
    assert table["tiers"]["normal_ckpt"] == "pool_normal_ckpt"
    assert table["tiers"]["critical"] == "pool_critical"
    plain = policy_table(_policy(POLICY.replace("      checkpointed: {grace_time: 45}\n", "")))
    assert "normal_ckpt" not in plain["tiers"]
    assert '["normal_ckpt"] = "pool_normal_ckpt"' in render_job_submit_lua(_policy())


def test_without_grace_time_the_ckpt_qos_has_none_killwait_applies() -> None:
    qos = desired_state(_policy(POLICY.replace("{grace_time: 45}", "{}"))).qos
    assert {q.grace_time for q in qos.values()} == {0}
    assert qos["pool_high_ckpt"].priority == 1900


def test_without_checkpointed_nothing_changes() -> None:
    qos = desired_state(_policy(POLICY.replace("      checkpointed: {grace_time: 45}\n", ""))).qos
    assert sorted(qos) == ["pool_critical", "pool_high", "pool_normal"]
    assert qos["pool_critical"].preempt == ("pool_high", "pool_normal")


def test_spare_plain_preempts_only_the_lower_tiers_checkpointing_jobs() -> None:
    """``checkpointed: {spare_plain: true}``: both QOS of a tier preempt the lower tiers' _ckpt
    QOS alone, and placement's sets (policy file) and sacctmgr's read-back say the same."""
    from hetrun.slurm_plugin import quota
    from hetrun.slurm_plugin.policy.desired import preemption_sets

    policy = _policy(POLICY.replace("{grace_time: 45}", "{spare_plain: true}"))
    qos = desired_state(policy).qos
    assert qos["pool_critical"].preempt == qos["pool_critical_ckpt"].preempt == ("pool_high_ckpt", "pool_normal_ckpt")
    assert qos["pool_high"].preempt == ("pool_normal_ckpt",) and qos["pool_normal"].preempt == ()
    assert {q.grace_time for q in qos.values()} == {0}
    both = ("pool_high_ckpt", "pool_normal_ckpt")
    assert preemption_sets(policy, "critical") == (both, both)  # every victim stops clean
    live = "\n".join(f"{q.name}|{q.priority}|{','.join(q.preempt)}|{q.preempt_mode}||||DenyOnLimit|00:00:00"
                     for q in qos.values())
    assert quota.preemption_of(live, "pool_critical") == (both, both)
    # the default preempts plain jobs too
    assert preemption_sets(_policy(), "critical")[0] == (
        "pool_high", "pool_high_ckpt", "pool_normal", "pool_normal_ckpt")


def test_spare_plain_placement_never_names_a_plain_job() -> None:
    """Every GPU node busy: a plain job that started 5 s ago (a100) and a checkpointing one that
    has run 10 minutes (v100). By default either may be named; with spare_plain a start by
    preemption can only take the checkpointing job's nodes, and names none."""
    from hetrun.slurm_plugin import placement
    from hetrun.slurm_plugin.policy.desired import preemption_sets
    from test_placement_preempt_loss import PAIR, busy_with

    snap = busy_with(("pool_normal", ("n1", "n2"), 5), ("pool_normal_ckpt", ("n3", "n4"), 600))
    policy = _policy(POLICY.replace("{grace_time: 45}", "{spare_plain: true}"))
    preempts, clean = preemption_sets(policy, "critical")
    need = dataclasses.replace(PAIR, preempts=preempts, stops_clean=clean)
    for cand in placement.score(need, snap):
        assert not set(cand.preempt_nodes) & {"n1", "n2"}
    best = placement.score(need, snap)[0]
    # every job it may preempt stops clean: Slurm's own choice loses ~0 too, so no node is named
    # (a --nodelist would tie the job to nodes that may be taken before it starts)
    assert best.gres == "gpu:v100" and best.preempt_nodes == []
    assert "a start by preemption loses ~0 node-s of work" in best.reasons


@pytest.mark.parametrize(("edit", "message"), [
    (("preemption: true", "preemption: false"), "checkpointed orders preemption, but preemption is off"),
    (("[critical, high, normal]", "[critical, high_ckpt, normal]"), "clashes with the _ckpt QOS"),
    (("grace_time: 45", "grace_time: 0"), "grace_time"),
    (("grace_time: 45", "grace_time: 2h"), "grace_time"),
    (("grace_time: 45", "grace: 45"), "grace"),
    (("grace_time: 45", "spare_plain: maybe"), "spare_plain"),
])
def test_refusals(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _policy(POLICY.replace(*edit))


def test_tiers_too_close_for_a_ckpt_qos_is_a_problem() -> None:
    text = POLICY + "tiers:\n  high: {priority: 1001}\n  normal: {priority: 1000}\n"
    desired = desired_state(_policy(text))
    assert any("tier 'high' (priority 1001) has no room" in p for p in desired.problems)
    assert desired.qos["pool_normal_ckpt"].priority == 900 and desired.qos["pool_normal_ckpt"].priority > 0

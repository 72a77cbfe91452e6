"""Policy plan without a cluster: desired Slurm objects, the sacctmgr commands, the
diff against a live state read from real sacctmgr/scontrol output, and the
slurm.conf rewrite (backup, idempotence, refusal of a foreign slurm.conf)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hetrun.slurm_plugin.cluster_conf import ClusterConfig, render_slurm_conf
from hetrun.slurm_plugin.policy.apply import (
    PolicyApplyError,
    apply_plan,
    conf_with_policy,
    rewrite_conf,
    write_conf,
)
from hetrun.slurm_plugin.policy.desired import desired_state
from hetrun.slurm_plugin.policy.lua import render_job_submit_lua
from hetrun.slurm_plugin.policy.model import load_policy
from hetrun.slurm_plugin.policy.plan import make_plan
from hetrun.slurm_plugin.policy.state import LiveState, parse_assocs, parse_config, parse_qos

POLICY = """\
resources:
  gpu:
    type: [a100]
    count: 8
    scheduling:
      priority: [critical, high, normal]
      preemption: true
  cpu: {cores: 8, isolation: none}
naming: {qos_prefix: pool_}
tiers:
  critical: {max_wall: "1-00:00:00", max_tres_per_user: {gpu: 4}}
accounts:
  vision:
    fairshare: 10
    quota: {gpu: 4, cpu: 6, mem: 8Gi}
    max_per_user: {gpu: 2}
    tiers: [high, normal]
    users: [alice]
"""

# What sacctmgr -n -P show qos/assoc printed on Slurm 22.05 after applying POLICY (format
# strings of hetrun.slurm_plugin.policy.state): memory comes back as 8G, names sorted.
LIVE_QOS = """\
normal|0||cluster||||
pool_critical|3000|pool_high,pool_normal|requeue|1-00:00:00||gres/gpu=4|DenyOnLimit
pool_high|2000|pool_normal|requeue||||DenyOnLimit
pool_normal|1000||requeue||||DenyOnLimit
"""
LIVE_ASSOC = """\
root|||1|||normal||
root|root||1|||normal||
vision|||10|cpu=6,gres/gpu=4,mem=8G||pool_high,pool_normal|pool_normal|root
vision|alice||1|gres/gpu=2||pool_high,pool_normal|pool_normal|
"""
# scontrol spells some keys its own way (PriorityWeightFairShare, capital S).
LIVE_CONFIG = """\
Configuration data as of 2026-12-01T15:19:22
AccountingStorageEnforce = associations,limits,qos,safe
AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/gpu:a100
JobRequeue              = 1
JobSubmitPlugins        = lua
PreemptMode             = REQUEUE
PreemptType             = preempt/qos
PriorityType            = priority/multifactor
PriorityWeightAge       = 100
PriorityWeightFairShare = 1000
PriorityWeightJobSize   = 0
PriorityWeightQOS       = 10000
SLURM_CONF              = /etc/slurm/slurm.conf
"""


@pytest.fixture
def policy(tmp_path: Path):
    p = tmp_path / "policy.yaml"
    p.write_text(POLICY)
    return load_policy(p)


def _plan(policy, live: LiveState, live_lua: str | None = None):
    lua = render_job_submit_lua(policy)
    return make_plan(desired_state(policy), live, lua, live_lua)


def test_plan_against_an_empty_cluster_creates_everything_in_order(policy) -> None:
    plan = _plan(policy, LiveState({}, {}, {}, {}))
    cmds = [" ".join(c) for ch in plan.changes for c in ch.commands]
    # Every QOS exists before any Preempt list names it.
    assert cmds[:3] == ["sacctmgr -i add qos pool_critical", "sacctmgr -i add qos pool_high",
                        "sacctmgr -i add qos pool_normal"]
    assert ("sacctmgr -i modify qos where name=pool_critical set Priority=3000 "
            "Preempt=pool_high,pool_normal PreemptMode=requeue MaxWall=1-00:00:00 "
            "MaxTRESPerUser=gres/gpu=4 Flags=DenyOnLimit") in cmds
    assert "sacctmgr -i add account vision Parent=root" in cmds
    assert ("sacctmgr -i modify account where name=vision set Fairshare=10 "
            "GrpTRES=cpu=6,gres/gpu=4,mem=8192 QOS=pool_high,pool_normal DefaultQOS=pool_normal") in cmds
    # The per-user cap is the GrpTRES of the user's own association.
    assert cmds[-2:] == ["sacctmgr -i add user alice Account=vision",
                         "sacctmgr -i modify user where name=alice account=vision set GrpTRES=gres/gpu=2"]
    assert plan.conf_values["PreemptType"] == "preempt/qos"
    assert plan.conf_values["AccountingStorageEnforce"] == "associations,limits,qos,safe"
    assert plan.conf_values["JobSubmitPlugins"] == "lua"
    assert [c.kind for c in plan.changes].count("job_submit.lua") == 1


def test_plan_against_the_applied_state_is_empty(policy) -> None:
    live = LiveState(parse_qos(LIVE_QOS), parse_assocs(LIVE_ASSOC), parse_config(LIVE_CONFIG), {})
    plan = _plan(policy, live, render_job_submit_lua(policy))
    assert plan.changes == [] and plan.in_sync


def test_drift_is_one_modify_with_the_minimal_set(policy) -> None:
    drifted = LIVE_QOS.replace("pool_high|2000|", "pool_high|5|").replace("|gres/gpu=4|DenyOnLimit",
                                                                           "|gres/gpu=4,cpu=9|DenyOnLimit")
    assoc = LIVE_ASSOC.replace("cpu=6,gres/gpu=4,mem=8G", "cpu=6,gres/gpu=2,node=3,mem=8G")
    live = LiveState(parse_qos(drifted), parse_assocs(assoc), parse_config(LIVE_CONFIG), {})
    plan = _plan(policy, live, render_job_submit_lua(policy))
    cmds = [" ".join(c) for ch in plan.changes for c in ch.commands]
    assert cmds == [
        "sacctmgr -i modify qos where name=pool_critical set MaxTRESPerUser=cpu=-1,gres/gpu=4",
        "sacctmgr -i modify qos where name=pool_high set Priority=2000",
        "sacctmgr -i modify account where name=vision set GrpTRES=cpu=6,gres/gpu=4,mem=8192,node=-1",
    ]


def test_conf_lists_keep_what_is_there(policy) -> None:
    config = parse_config(LIVE_CONFIG.replace(",gres/gpu:a100", "").replace("lua", "(null)"))
    live = LiveState(parse_qos(LIVE_QOS), parse_assocs(LIVE_ASSOC), config, {})
    plan = _plan(policy, live)
    conf = {c.target: c.fields[0].wanted for c in plan.by_kind("slurm.conf")}
    assert conf == {"JobSubmitPlugins": "lua", "AccountingStorageTRES":
                    "cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/gpu:a100"}


def test_apply_runs_exactly_the_plans_commands_and_skips_conf_without_write_conf(policy) -> None:
    plan = _plan(policy, LiveState({}, {}, {}, {}))
    ran: list[tuple[str, ...]] = []
    result = apply_plan(plan, None, lambda argv: ran.append(tuple(argv)) or "")
    assert ran == [c for ch in plan.changes for c in ch.commands]
    assert "PreemptType" in result.skipped_conf and "job_submit.lua" in result.skipped_conf


def test_time_slicing_on_a_missing_partition_is_a_problem_apply_refuses(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(POLICY + 'time_slicing: {partition: short, max_wall: "10:00"}\n')
    pol = load_policy(p)
    plan = _plan(pol, LiveState({}, {}, {}, {"debug": {"PartitionName": "debug", "OverSubscribe": "NO"}}))
    assert plan.problems and "'short'" in plan.problems[0]
    with pytest.raises(PolicyApplyError, match="does not fit this cluster"):
        apply_plan(plan, None, lambda argv: "")
    plan = _plan(pol, LiveState({}, {}, {}, {"short": {"PartitionName": "short", "OverSubscribe": "NO"}}))
    part = plan.by_kind("partition")[0]
    assert part.commands == (("scontrol", "update", "PartitionName=short", "OverSubscribe=FORCE:2"),)
    assert plan.conf_values["PreemptMode"] == "REQUEUE,GANG"


def _hetrun_conf(tmp_path: Path) -> Path:
    cfg = ClusterConfig(directory=tmp_path / "c", slurm_etc=tmp_path / "etc", hostname="h")
    conf = tmp_path / "slurm.conf"
    conf.write_text(render_slurm_conf(cfg))
    return conf


def test_write_conf_backs_up_rewrites_in_place_and_is_idempotent(policy, tmp_path: Path) -> None:
    conf = _hetrun_conf(tmp_path)
    before = conf.read_text()
    plan = _plan(policy, LiveState({}, {}, parse_config("PreemptType = preempt/partition_prio\n"), {}))
    backup, lua = write_conf(plan, conf)
    assert backup is not None and backup.read_text() == before
    assert lua == tmp_path / "job_submit.lua" and lua.read_text() == plan.lua
    text = conf.read_text()
    assert "PreemptType=preempt/qos" in text and "preempt/partition_prio" not in text
    assert text.count("PreemptType=") == 1
    # New keys go before the node lines, in one marked block.
    assert text.index("JobSubmitPlugins=lua") < text.index("NodeName=")
    assert write_conf(plan, conf) == (None, None)
    assert conf.read_text() == text


def test_rewrite_conf_sets_partition_options() -> None:
    text = "A=1\nPartitionName=short Nodes=n1 OverSubscribe=NO State=UP\nPartitionName=other Nodes=n2\n"
    out = rewrite_conf(text, {"A": "2"}, {"short": {"OverSubscribe": "FORCE:2"}, "other": {"OverSubscribe": "FORCE:4"}})
    assert out == ("A=2\nPartitionName=short Nodes=n1 OverSubscribe=FORCE:2 State=UP\n"
                   "PartitionName=other Nodes=n2 OverSubscribe=FORCE:4\n")


def test_a_foreign_slurm_conf_is_refused_unless_allowed(policy, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(textwrap.dedent("""\
        ClusterName=site
        PreemptType=preempt/none
        NodeName=a1 CPUs=4
        """))
    plan = _plan(policy, LiveState({}, {}, {}, {}))
    with pytest.raises(PolicyApplyError, match="was not written by `hetrun cluster up`"):
        write_conf(plan, conf)
    assert "preempt/none" in conf.read_text()
    backup, _ = write_conf(plan, conf, foreign_conf=True)
    assert backup is not None and "preempt/none" in backup.read_text()
    assert "PreemptType=preempt/qos" in conf.read_text()


def test_associations_are_scoped_to_the_live_cluster(policy) -> None:
    # One slurmdbd may serve several clusters; QOS are global, associations are not.
    plan = _plan(policy, LiveState({}, {}, {}, {}, cluster="site"))
    cmds = [" ".join(c) for ch in plan.changes for c in ch.commands]
    assert "sacctmgr -i add account vision Parent=root Cluster=site" in cmds
    assert any(c.startswith("sacctmgr -i modify account where name=vision cluster=site set ") for c in cmds)
    assert "sacctmgr -i add user alice Account=vision Cluster=site" in cmds
    assert "sacctmgr -i add qos pool_high" in cmds


def _backfill_policy(tmp_path: Path, block: str, weights: str = ""):
    p = tmp_path / "policy.yaml"
    p.write_text(POLICY.replace("preemption: true", f"preemption: true\n      backfill: {block}") + weights)
    return load_policy(p)


def test_backfill_min_reserve_tier_renders_bf_min_prio_reserve_above_every_lower_job(tmp_path: Path) -> None:
    # QOS factor of pool_normal: 10000 * 1000 / 3000 = 3333, plus age 100 + fairshare 1000 at most:
    # 4433. A high job's priority is at least 10000 * 2000 / 3000 = 6666.
    policy = _backfill_policy(tmp_path, "{min_reserve_tier: high, busy_nodes: true}")
    desired = desired_state(policy)
    assert desired.problems == []
    setting = next(s for s in desired.conf if s.key == "SchedulerParameters")
    assert setting.value == "bf_min_prio_reserve=4434,bf_busy_nodes" and setting.contains
    live = LiveState(parse_qos(LIVE_QOS), parse_assocs(LIVE_ASSOC), parse_config(
        LIVE_CONFIG + "SchedulerParameters     = bf_interval=2,bf_min_prio_reserve=10,sched_interval=2\n"), {})
    plan = make_plan(desired, live, render_job_submit_lua(policy), render_job_submit_lua(policy))
    # Keys compare by name: the live bf_min_prio_reserve is replaced in place, the rest kept.
    assert [(c.target, c.fields[0].wanted) for c in plan.by_kind("slurm.conf")] == [
        ("SchedulerParameters", "bf_interval=2,bf_min_prio_reserve=4434,sched_interval=2,bf_busy_nodes")]
    rendered, _ = conf_with_policy(render_slurm_conf(ClusterConfig(nodes=2)), policy)
    assert "SchedulerParameters=bf_interval=2,sched_interval=2,bf_min_prio_reserve=4434,bf_busy_nodes" in rendered
    # The lowest tier reserves anyway: Slurm's default, 0.
    lowest = _backfill_policy(tmp_path, "{min_reserve_tier: normal}")
    assert next(s.value for s in desired_state(lowest).conf if s.key == "SchedulerParameters") \
        == "bf_min_prio_reserve=0"


def test_backfill_tiers_that_weights_cannot_separate_are_a_problem(tmp_path: Path) -> None:
    policy = _backfill_policy(tmp_path, "{min_reserve_tier: critical}",
                              "priority_weights: {qos: 1000, fairshare: 1000, age: 0}\n")
    problems = desired_state(policy).problems
    assert len(problems) == 1 and "min_reserve_tier 'critical'" in problems[0]
    assert "can reach priority 1666" in problems[0] and "as low as 1000" in problems[0]

"""`hetrun policy apply` against the real local cluster's accounting (slurmdbd + MariaDB).

Only the sacctmgr half runs here: the shared test cluster's slurm.conf must not
change (others' tests use it), so slurm.conf settings and job_submit.lua stay
unwritten (tests/test_policy_plan.py and test_policy_lua.py cover them off-line).
Every object these tests create is named hrtest* and deleted afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hetrun.slurm_plugin.policy.apply import apply_plan, plan_live
from hetrun.slurm_plugin.policy.isolation import detect_cgroup
from hetrun.slurm_plugin.policy.model import load_policy

pytestmark = pytest.mark.slurm

# numa-aware needs cgroups on the nodes (this host): without them apply rightly refuses the
# policy (tests/test_policy_isolation.py), so such a host tests the rest with isolation none.
POLICY_TEMPLATE = """\
resources:
  gpu:
    type: ["V100", "A100"]
    count: 8
    scheduling:
      priority: ["critical", "high", "normal"]
      preemption: true
  cpu:
    cores: 8
    memory: 16Gi
    isolation: "{isolation}"
naming: {qos_prefix: hrtest_}
tiers:
  critical: {max_wall: "1-00:00:00", max_tres_per_user: {gpu: 4}}
  normal: {grp_tres: {cpu: 8}}
accounts:
  hrtest_vision:
    fairshare: 10
    quota: {gpu: 4, cpu: 6, mem: 8Gi}
    max_per_user: {gpu: 2}
    max_wall: "12:00:00"
    tiers: [high, normal]
    users: [hrtest_alice, hrtest_bob]
  hrtest_nlp:
    quota: {gpu: 2}
"""
POLICY = POLICY_TEMPLATE.replace("{isolation}", "numa-aware" if detect_cgroup().usable else "none")


def _sacctmgr(*args: str) -> str:
    return subprocess.run(["sacctmgr", "-n", "-P", *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def _cleanup() -> None:
    users = {ln.split("|")[1] for ln in _sacctmgr("show", "assoc", "format=Account,User").splitlines()
             if ln.startswith("hrtest") and ln.split("|")[1]}
    accounts = {ln.split("|")[0] for ln in _sacctmgr("show", "assoc", "format=Account,User").splitlines()
                if ln.startswith("hrtest")}
    qos = {ln for ln in _sacctmgr("show", "qos", "format=Name").splitlines() if ln.startswith("hrtest")}
    for kind, names in (("user", users), ("account", accounts), ("qos", qos)):
        if names:
            subprocess.run(["sacctmgr", "-i", "delete", kind, ",".join(sorted(names))], capture_output=True,
                           check=False, timeout=60)


@pytest.fixture
def policy_file(slurm_cluster, shared_tmp: Path) -> Iterator[Path]:
    _cleanup()
    path = shared_tmp / "policy.yaml"
    path.write_text(POLICY)
    yield path
    _cleanup()


def test_apply_creates_what_the_yaml_says_and_a_second_apply_is_a_no_op(policy_file: Path) -> None:
    policy = load_policy(policy_file)
    plan, conf = plan_live(policy)
    first = apply_plan(plan, conf)
    assert first.commands and "PreemptType" in first.skipped_conf

    qos = {ln.split("|")[0]: ln.split("|")[1:] for ln in _sacctmgr(
        "show", "qos", "format=Name,Priority,Preempt,PreemptMode,MaxWall,GrpTRES,MaxTRESPU,Flags").splitlines()}
    assert qos["hrtest_critical"] == ["3000", "hrtest_high,hrtest_normal", "requeue", "1-00:00:00", "",
                                      "gres/gpu=4", "DenyOnLimit"]
    assert qos["hrtest_high"] == ["2000", "hrtest_normal", "requeue", "", "", "", "DenyOnLimit"]
    assert qos["hrtest_normal"] == ["1000", "", "requeue", "", "cpu=8", "", "DenyOnLimit"]
    assoc = {tuple(ln.split("|")[:2]): ln.split("|")[2:] for ln in _sacctmgr(
        "show", "assoc", "format=Account,User,Fairshare,GrpTRES,MaxWall,QOS,DefaultQOS").splitlines()}
    assert assoc[("hrtest_vision", "")] == ["10", "cpu=6,gres/gpu=4,mem=8G", "12:00:00",
                                           "hrtest_high,hrtest_normal", "hrtest_normal"]
    for user in ("hrtest_alice", "hrtest_bob"):
        # The per-user cap (max_per_user) is the GrpTRES of the user's own association.
        assert assoc[("hrtest_vision", user)][1] == "gres/gpu=2"
        assert assoc[("hrtest_vision", user)][-2:] == ["hrtest_high,hrtest_normal", "hrtest_normal"]
    assert assoc[("hrtest_nlp", "")][1] == "gres/gpu=2"
    assert assoc[("hrtest_nlp", "")][-2:] == ["hrtest_critical,hrtest_high,hrtest_normal", "hrtest_normal"]

    again, conf = plan_live(policy)
    assert [c for c in again.changes if c.kind in ("qos", "account", "user")] == []
    second = apply_plan(again, conf)
    assert second.commands == []


def test_drift_is_planned_and_repaired(policy_file: Path) -> None:
    policy = load_policy(policy_file)
    plan, conf = plan_live(policy)
    apply_plan(plan, conf)
    subprocess.run(["sacctmgr", "-i", "modify", "qos", "where", "name=hrtest_high", "set", "Priority=7",
                    "Preempt="], check=True, capture_output=True, timeout=60)
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "policy", "plan", str(policy_file)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "modify qos hrtest_high" in out.stdout
    assert "$ sacctmgr -i modify qos where name=hrtest_high set Priority=2000 Preempt=hrtest_normal" in out.stdout
    status = subprocess.run([sys.executable, "-m", "hetrun.cli", "policy", "status", str(policy_file)],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "modify qos hrtest_high" in status.stdout
    applied = subprocess.run([sys.executable, "-m", "hetrun.cli", "policy", "apply", str(policy_file)],
                             capture_output=True, text=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert "not written (pass --write-conf)" in applied.stdout
    again, _ = plan_live(policy)
    assert [c for c in again.changes if c.kind == "qos"] == []

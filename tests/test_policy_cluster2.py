"""The whole policy, live, on a second throw-away cluster (tests/second_cluster.py):
`policy apply --write-conf` switches it to preempt/qos + multifactor + job_submit/lua,
then real slurmctld decides:

- a job naming no tier gets the default tier's QOS (the lua, in slurmctld);
- a job over its account's quota is refused at submission with the policy's message;
- a second apply, slurm.conf included, changes nothing.

A critical job preempting a normal hetrun job through preempt/qos, and time
slicing, are in tests/test_policy_preempt_live.py (a cluster started with the policy).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hetrun.slurm_plugin.policy.apply import apply_plan, plan_live
from hetrun.slurm_plugin.policy.model import load_policy
from hetrun.slurm_plugin.policy.state import Runner
from second_cluster import NAME, SecondCluster, policy_text

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

POLICY = policy_text(2)


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[SecondCluster]:
    c = SecondCluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()  # also deletes the hrtest2_* QOS from the shared slurmdbd


def runner(c: SecondCluster) -> Runner:
    return lambda argv: c.run(*argv).stdout


@pytest.fixture(scope="module")
def applied(cluster: SecondCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    plan, conf = plan_live(load_policy(path), runner(cluster))
    assert conf == cluster.cfg.slurm_conf
    result = apply_plan(plan, conf, runner(cluster), write_conf_file=True, reconfigure=False)
    assert result.backup is not None and result.lua_path == conf.parent / "job_submit.lua"
    assert "PreemptType" in result.restart_needed
    cluster.restart()
    return path


def sbatch(c: SecondCluster, *args: str, check: bool = True):
    return c.run("sbatch", "--parsable", "-o", "/dev/null", "-A", "hrtest2_team", *args, check=check)


def job(c: SecondCluster, job_id: str) -> dict:
    jobs = json.loads(c.run("squeue", "--json", "-j", job_id).stdout)["jobs"]
    return jobs[0] if jobs else {}


def test_config_and_second_apply_is_a_no_op(cluster: SecondCluster, applied: Path) -> None:
    config = cluster.run("scontrol", "show", "config").stdout
    assert f"ClusterName             = {NAME}" in config
    assert "PreemptType             = preempt/qos" in config
    assert "JobSubmitPlugins        = lua" in config
    plan, conf = plan_live(load_policy(applied), runner(cluster))
    assert plan.changes == [], [(c.kind, c.target, c.fields) for c in plan.changes]
    assert apply_plan(plan, conf, runner(cluster), write_conf_file=True).commands == []


def test_lua_gives_the_default_tier_and_refuses_over_quota(cluster: SecondCluster, applied: Path) -> None:
    job_id = sbatch(cluster, "--hold", "-n1", "--wrap", "sleep 1").stdout.strip().split(";")[0]
    assert job(cluster, job_id)["qos"] == "hrtest2_normal"
    # `low` is a hetrun QoS class, not a QOS: only the lua makes it a tier.
    low = sbatch(cluster, "--hold", "-n1", "--qos=low", "--wrap", "sleep 1").stdout.strip().split(";")[0]
    assert job(cluster, low)["qos"] == "hrtest2_normal"
    cluster.run("scancel", job_id, low)
    refused = sbatch(cluster, "-N2", "--gres=gpu:2", "--wrap", "sleep 1", check=False)
    assert refused.returncode != 0
    assert "account hrtest2_team's quota is GrpTRES gres/gpu=2" in refused.stderr
    assert "gres/gpu=4" in refused.stderr

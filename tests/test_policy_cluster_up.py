"""`hetrun cluster up --policy FILE` without starting anything: the local cluster's
slurm.conf is rendered with the policy's settings in it and job_submit.lua next to
it, so slurmctld starts with the policy instead of being restarted into it; the
policy path is kept in cluster.json for later `up`s. The live half (daemons, then
the QOS/accounts applied) runs in tests/test_policy_preempt_live.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.slurm_plugin.cluster_conf import ClusterConfig
from hetrun.slurm_plugin.cluster_setup import write_configs
from hetrun.slurm_plugin.policy.apply import PolicyApplyError
from hetrun.slurm_plugin.policy.desired import desired_state
from hetrun.slurm_plugin.policy.lua import render_job_submit_lua
from hetrun.slurm_plugin.policy.model import load_policy
from hetrun.slurm_plugin.policy.plan import make_plan
from hetrun.slurm_plugin.policy.state import LiveState

from hetrun.errors import SlurmError

POLICY = """\
resources:
  gpu:
    count: 8
    scheduling:
      priority: [critical, high, normal]
      preemption: true
  cpu: {cores: 8, isolation: numa-aware}
naming: {qos_prefix: pool_}
accounts:
  vision: {quota: {gpu: 4}, users: [alice]}
time_slicing: {partition: debug, max_wall: "00:10:00", jobs_per_core: 2}
"""


def _cfg(tmp_path: Path, text: str | None = POLICY) -> ClusterConfig:
    path = None
    if text is not None:
        path = tmp_path / "policy.yaml"
        path.write_text(text)
    return ClusterConfig(directory=tmp_path / "c", slurm_etc=tmp_path / "etc", hostname="h",
                         policy=str(path) if path else None)


def _as_live_config(conf: str) -> dict[str, str]:
    """slurm.conf's own lines, as `scontrol show config` would report them."""
    out = {}
    for line in conf.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and key not in ("NodeName", "PartitionName"):
            out[key] = value
    return out


def test_up_with_a_policy_renders_its_settings_and_lua(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    changed = write_configs(cfg)
    assert changed["slurm.conf"]
    conf = cfg.slurm_conf.read_text()
    policy = load_policy(cfg.policy or "")
    for line in ("PreemptType=preempt/qos", "JobSubmitPlugins=lua", "PriorityType=priority/multifactor",
                 "TaskPlugin=task/cgroup,task/affinity", "PreemptMode=REQUEUE,GANG"):
        assert conf.count(line.split("=")[0] + "=") == 1 and line in conf, line
    # List-valued keys keep the cluster's own items (config_overrides lets emulated nodes start).
    assert "SlurmdParameters=config_overrides,numa_node_as_socket" in conf
    assert "PartitionName=debug " in conf and "OverSubscribe=FORCE:2" in conf.split("PartitionName=debug")[1]
    assert (cfg.etc / "job_submit.lua").read_text() == render_job_submit_lua(policy)
    # What the policy plan would want of a cluster running this file: nothing more.
    live = LiveState({}, {}, _as_live_config(conf),
                     {"debug": {"PartitionName": "debug", "OverSubscribe": "FORCE:2"}})
    plan = make_plan(desired_state(policy), live, render_job_submit_lua(policy),
                     (cfg.etc / "job_submit.lua").read_text())
    assert plan.by_kind("slurm.conf", "job_submit.lua", "partition") == []
    # A second `up` renders the same files: no daemon restart.
    assert not write_configs(cfg)["slurm.conf"]
    assert ClusterConfig.from_json(cfg.to_json()) == cfg


def test_up_without_a_policy_is_unchanged(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, None)
    write_configs(cfg)
    conf = cfg.slurm_conf.read_text()
    assert "PreemptType=preempt/partition_prio" in conf and "JobSubmitPlugins" not in conf
    assert not (cfg.etc / "job_submit.lua").exists()


def test_a_missing_time_slicing_partition_is_a_clear_error(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, POLICY.replace("partition: debug", "partition: short"))
    with pytest.raises(PolicyApplyError, match=r"time_slicing.partition 'short' is not a partition") as err:
        write_configs(cfg)
    assert "debug, high" in str(err.value)


def test_a_relative_policy_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="not an absolute path"):
        ClusterConfig(directory=tmp_path, policy="policy.yaml")


def test_cluster_up_checks_the_policy_before_touching_any_daemon(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("resources:\n  gpu:\n    count: x\n")
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "cluster", "up", "--no-install", "--policy", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert f"{bad}:3:12: resources.gpu.count: expected an integer" in out.stderr
    assert "Traceback" not in out.stderr

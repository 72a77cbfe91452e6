"""cpu.isolation and gpu.sharing off-line: the nodes' cgroup version read from a mount
table, the cgroup.conf rendered for it, isolation planned as unsupported where cgroups
cannot confine tasks, and the local cluster's node files (shards, sockets, cgroup.conf,
fake GPU devices) written from the policy. The live half: tests/test_policy_isolation_live.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hetrun.slurm_plugin.cluster_conf import (
    FAKE_GPU_MAJOR,
    ClusterConfig,
    render_gres_conf,
    render_slurm_conf,
)
from hetrun.slurm_plugin.cluster_setup import write_configs
from hetrun.slurm_plugin.policy.apply import PolicyApplyError, apply_plan
from hetrun.slurm_plugin.policy.desired import desired_state
from hetrun.slurm_plugin.policy.isolation import (
    CgroupSupport,
    detect_cgroup,
    isolation_problem,
    render_cgroup_conf,
)
from hetrun.slurm_plugin.policy.lua import render_job_submit_lua
from hetrun.slurm_plugin.policy.model import PolicySpec, validate_policy_data
from hetrun.slurm_plugin.policy.nodes import node_setup
from hetrun.slurm_plugin.policy.plan import make_plan
from hetrun.slurm_plugin.policy.state import LiveState

from hetrun.errors import SlurmError

V1 = CgroupSupport("v1", (), "cgroup v1")
NONE = CgroupSupport(None, (), "neither cgroup2 nor cgroup v1 controllers are mounted at /sys/fs/cgroup")


def _policy(isolation: str = "numa-aware", shards: int | None = None) -> PolicySpec:
    gpu: dict[str, object] = {"count": 4}
    if shards:
        gpu["sharing"] = {"shards_per_gpu": shards}
    return validate_policy_data({"resources": {"gpu": gpu, "cpu": {"cores": 4, "isolation": isolation}}})


def _v1_host(tmp_path: Path, controllers: tuple[str, ...]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    lines = [f"tmpfs {root} tmpfs rw 0 0"]
    for ctrl in controllers:
        (root / ctrl).mkdir(parents=True)
        lines.append(f"cgroup {root / ctrl} cgroup rw,relatime,{ctrl} 0 0")
    # A hybrid host's cgroup2 mount below the root does not make it v2.
    lines.append(f"cgroup2 {root}/unified cgroup2 rw 0 0")
    table = tmp_path / "mounts"
    table.write_text("\n".join(lines) + "\n")
    return root, table


def test_detects_cgroup_v1_with_the_controllers_slurm_needs(tmp_path: Path) -> None:
    root, table = _v1_host(tmp_path, ("cpuset", "cpu", "memory", "devices", "freezer"))
    got = detect_cgroup(root, table)
    assert got.version == "v1" and got.usable, got
    assert "CgroupPlugin=cgroup/v1" in render_cgroup_conf(got)


def test_v1_without_the_memory_controller_is_unusable(tmp_path: Path) -> None:
    root, table = _v1_host(tmp_path, ("cpuset", "devices", "freezer"))
    got = detect_cgroup(root, table)
    assert got.version == "v1" and got.missing == ("memory",)
    problem = isolation_problem("cores", got)
    assert problem and "missing or not writable: memory" in problem and "cpu.isolation: none" in problem


def test_detects_cgroup_v2(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    table = tmp_path / "mounts"
    table.write_text(f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n")
    got = detect_cgroup(root, table)
    assert got == CgroupSupport("v2", (), got.detail) and got.usable
    conf = render_cgroup_conf(got)
    assert "CgroupPlugin=cgroup/v2" in conf and "IgnoreSystemd=yes" in conf
    (root / "cgroup.controllers").write_text("cpu io pids\n")
    assert detect_cgroup(root, table).missing == ("cpuset", "memory")


def test_no_cgroups_at_all(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text("proc /proc proc rw 0 0\n")
    got = detect_cgroup(tmp_path / "cgroup", table)
    assert got.version is None and not got.usable
    assert isolation_problem("none", got) is None
    assert "numa-aware needs task/cgroup" in (isolation_problem("numa-aware", got) or "")


def test_unknown_version_lets_slurm_autodetect() -> None:
    conf = render_cgroup_conf(None)
    assert "CgroupPlugin=autodetect" in conf
    for line in ("ConstrainCores=yes", "ConstrainRAMSpace=yes", "ConstrainDevices=yes"):
        assert line in conf


def test_plan_prints_the_cgroup_conf_of_the_nodes_version() -> None:
    desired = desired_state(_policy(), V1)
    assert desired.problems == []
    assert any("CgroupPlugin=cgroup/v1" in frag for frag in desired.manual), desired.manual
    assert not any("cgroup" in frag for frag in desired_state(_policy("none"), NONE).manual)


def test_isolation_without_cgroups_is_a_plan_problem_apply_refuses() -> None:
    policy = _policy()
    plan = make_plan(desired_state(policy, NONE), LiveState({}, {}, {}, {}), render_job_submit_lua(policy), None)
    assert len(plan.problems) == 1 and "numa-aware needs task/cgroup" in plan.problems[0]
    assert not plan.in_sync
    with pytest.raises(PolicyApplyError, match="does not fit this cluster"):
        apply_plan(plan, None, run=lambda argv: pytest.fail(f"ran {argv}"))


def test_node_setup_for_the_local_cluster() -> None:
    shared = node_setup(_policy("none", shards=4), 2, 2, "p")
    assert shared.shards_per_gpu == 4 and shared.gpu_devices and shared.cgroup_conf is None
    assert node_setup(_policy("none", shards=4), 2, 0, "p").shards_per_gpu == 0  # no GPUs, no shards
    assert not node_setup(_policy("none"), 2, 2, "p").gpu_devices  # plain files, as without a policy
    setup = node_setup(_policy(), 1, 2, "p", V1)
    assert setup.gpu_devices and "CgroupPlugin=cgroup/v1" in (setup.cgroup_conf or "")
    with pytest.raises(SlurmError, match=r"policy\.yaml: cpu\.isolation: numa-aware needs task/cgroup"):
        node_setup(_policy(), 1, 2, "policy.yaml", NONE)
    too_many = (os.cpu_count() or 1) + 1
    with pytest.raises(SlurmError, match=f"claims cpus={too_many} on a host with"):
        node_setup(_policy(), too_many, 2, "p", V1)


def test_node_lines_and_gres_conf_carry_shards_and_sockets(tmp_path: Path) -> None:
    cfg = ClusterConfig(nodes=3, cpus=2, gpus=2, mem_mb=256, sockets=2, cpu_nodes=1,
                        directory=tmp_path, hostname="h")
    conf = render_slurm_conf(cfg, shards_per_gpu=3)
    assert "NodeName=n[1-2] " in conf and " Sockets=2 CoresPerSocket=1 " in conf
    assert conf.count("Gres=gpu:2,shard:6 ") == 1 and "NodeName=n3 " in conf
    gres = render_gres_conf(cfg, 3)
    assert f"NodeName=n[1-2] Name=shard Count=6 File={tmp_path}/fakegpu/gpu[0-1]\n" in gres
    assert "shard" not in render_gres_conf(cfg) and "shard" not in render_slurm_conf(cfg)
    with pytest.raises(SlurmError, match="sockets=3 does not divide cpus=2"):
        ClusterConfig(cpus=2, sockets=3, directory=tmp_path)


@pytest.mark.skipif(os.geteuid() != 0 or not detect_cgroup().usable, reason="mknod needs root; cgroups needed")
def test_cluster_up_writes_the_node_files_of_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("resources:\n  gpu: {count: 2, sharing: {shards_per_gpu: 2}}\n"
                    "  cpu: {cores: 1, isolation: numa-aware}\n")
    cfg = ClusterConfig(nodes=1, cpus=1, gpus=2, mem_mb=256, directory=tmp_path / "c",
                        slurm_etc=tmp_path / "etc", hostname="h", policy=str(path))
    write_configs(cfg)
    assert f"CgroupPlugin=cgroup/{detect_cgroup().version}" in (cfg.etc / "cgroup.conf").read_text()
    conf = cfg.slurm_conf.read_text()
    assert "Gres=gpu:2,shard:4 " in conf and "GresTypes=gpu,shard\n" in conf
    assert "TaskPlugin=task/cgroup,task/affinity\n" in conf
    for i, gpu in enumerate(sorted((cfg.directory / "fakegpu").iterdir())):
        st = gpu.stat()
        assert gpu.is_char_device() and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (FAKE_GPU_MAJOR, i)
    assert not any(write_configs(cfg).values()), "a second up changes nothing"

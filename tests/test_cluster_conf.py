"""Local-cluster configuration: rendering, validation, the /etc/slurm link, pid checks (no daemons)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hetrun.slurm_plugin import cluster
from hetrun.slurm_plugin.cluster_conf import (
    TASK_ENV,
    ClusterConfig,
    physical_memory_mb,
    render_gres_conf,
    render_requeue_nudge,
    render_slurm_conf,
    render_slurmdbd_conf,
    render_task_prolog,
)
from hetrun.slurm_plugin.cluster_procs import find_pids, process_matches, read_pid

from hetrun.errors import SlurmError


def _cfg(tmp_path: Path, **kw: Any) -> ClusterConfig:
    return ClusterConfig(directory=tmp_path / "c", slurm_etc=tmp_path / "etc-slurm", hostname="h", **kw)


def _conf_map(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and not line.startswith(("NodeName", "PartitionName")):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def test_slurm_conf_has_what_het_jobs_preemption_and_accounting_need(tmp_path: Path) -> None:
    text = render_slurm_conf(_cfg(tmp_path))
    conf = _conf_map(text)
    assert conf["SchedulerType"] == "sched/backfill"
    assert conf["SchedulerParameters"] == "bf_interval=2,sched_interval=2"
    assert conf["PreemptType"] == "preempt/partition_prio"
    assert conf["PreemptMode"] == "REQUEUE"
    assert conf["JobRequeue"] == "1"
    assert conf["ProctrackType"] == "proctrack/linuxproc"
    assert conf["TaskPlugin"] == "task/none"
    assert conf["SelectType"] == "select/cons_tres"
    assert conf["SelectTypeParameters"] == "CR_Core_Memory"
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["TaskProlog"] == f"{tmp_path}/c/etc/task_prolog.sh"
    assert conf["EpilogSlurmctld"] == f"{tmp_path}/c/etc/requeue_nudge.sh"
    assert "%n" in conf["SlurmdPidFile"] and "%n" in conf["SlurmdSpoolDir"]
    assert "NodeName=n[1-4] NodeHostname=h NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=2 " in text
    assert "RealMemory=4000 Gres=gpu:2" in text
    assert "PartitionName=debug Nodes=n[1-4] Default=YES PriorityTier=1" in text
    assert "PartitionName=high Nodes=n[1-4] PriorityTier=10" in text
    # Nothing the daemons write lives under /tmp (each slurmd has a private one).
    assert "/tmp" not in text.replace(str(tmp_path), "<t>")


def test_shapes_render_consistently(tmp_path: Path) -> None:
    one = _cfg(tmp_path, nodes=1, gpus=1)
    assert "NodeName=n1 " in render_slurm_conf(one) and "Port=17001 " in render_slurm_conf(one)
    assert f"File={tmp_path}/c/fakegpu/gpu0\n" in render_gres_conf(one)
    eight = _cfg(tmp_path, nodes=8, gpus=4, mem_mb=1000)
    assert "Port=[17001-17008]" in render_slurm_conf(eight)
    assert f"NodeName=n[1-8] Name=gpu File={tmp_path}/c/fakegpu/gpu[0-3]" in render_gres_conf(eight)
    nogpu = _cfg(tmp_path, gpus=0)
    assert "Gres=" not in render_slurm_conf(nogpu)
    assert "Name=gpu" not in render_gres_conf(nogpu)


def test_slurmdbd_conf_carries_the_password(tmp_path: Path) -> None:
    text = render_slurmdbd_conf(_cfg(tmp_path), "abc123")
    assert "StoragePass=abc123\n" in text
    assert "StorageType=accounting_storage/mysql\n" in text


def test_task_prolog_exports_loopback_mpi_settings(tmp_path: Path) -> None:
    script = tmp_path / "prolog.sh"
    script.write_text(render_task_prolog())
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True).stdout
    exported = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    assert exported["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert exported["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert exported["OMPI_MCA_btl"] == "self,tcp"
    assert exported["OMPI_MCA_btl_tcp_if_include"] == "lo"
    assert exported["OMPI_MCA_oob_tcp_if_include"] == "lo"
    assert exported == TASK_ENV


@pytest.mark.parametrize(
    ("key", "value"), [("nodes", 0), ("nodes", 65), ("cpus", 0), ("gpus", -1), ("mem_mb", 10)]
)
def test_out_of_range_values_are_refused(tmp_path: Path, key: str, value: int) -> None:
    with pytest.raises(SlurmError, match=f"{key}={value}"):
        _cfg(tmp_path, **{key: value})


def test_gpu_type_names_follow_the_job_specs_one_rule(tmp_path: Path) -> None:
    """cluster up's --gpu-types takes what a job's gpu_types / --gres take (dag.validators.check_gpu_type),
    and each becomes a valid partition name gpu-<type> and gres.conf Type=."""
    from hetrun.dag.validators import check_one_partition
    from hetrun.slurm_plugin.cluster_conf import node_groups

    cfg = _cfg(tmp_path, nodes=3, gpus=1, gpu_types=("a100", "H100_80gb", "mi-250.x"))
    assert [g.partition for g in node_groups(cfg)] == ["gpu-a100", "gpu-H100_80gb", "gpu-mi-250.x"]
    assert all(check_one_partition(g.partition) for g in node_groups(cfg))
    assert "Type=H100_80gb" in render_gres_conf(cfg)
    for bad in ("a 100", "x" * 33, "a100;rm"):
        with pytest.raises(SlurmError, match="not a valid GPU type"):
            _cfg(tmp_path, nodes=2, gpus=1, gpu_types=(bad,))
    with pytest.raises(SlurmError, match="not a list of distinct names"):
        _cfg(tmp_path, nodes=2, gpus=1, gpu_types=("a100", "A100"))


def test_memory_beyond_this_machine_is_refused_with_a_fitting_suggestion(tmp_path: Path) -> None:
    total = physical_memory_mb()
    assert total > 0
    with pytest.raises(SlurmError) as info:
        _cfg(tmp_path, nodes=4, mem_mb=total)
    assert "exceeds this machine" in str(info.value) and "--mem-mb" in str(info.value)
    # The suggestion itself fits.
    suggested = int(str(info.value).split("--mem-mb ")[1].split()[0])
    _cfg(tmp_path, nodes=4, mem_mb=suggested)


def test_default_shape_fits_a_24_gib_machine() -> None:
    cfg = ClusterConfig()
    assert cfg.nodes * cfg.mem_mb <= 24 * 1024 * 3 // 4


def test_config_round_trips_through_json(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, nodes=3, cpus=4, gpus=1, mem_mb=2000)
    assert ClusterConfig.from_json(cfg.to_json()) == cfg


def test_slurm_conf_link_is_created_and_kept(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cluster.link_slurm_conf(cfg)
    link = cfg.slurm_etc / "slurm.conf"
    assert link.is_symlink() and Path(os.readlink(link)) == cfg.slurm_conf
    cluster.link_slurm_conf(cfg)  # second time: nothing to do, no error
    assert Path(os.readlink(link)) == cfg.slurm_conf


def test_foreign_slurm_conf_is_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg.slurm_etc.mkdir(parents=True)
    foreign = cfg.slurm_etc / "slurm.conf"
    foreign.write_text("ClusterName=production\n")
    with pytest.raises(SlurmError, match="not hetrun's") as info:
        cluster.link_slurm_conf(cfg)
    assert "mv " in str(info.value)
    assert foreign.read_text() == "ClusterName=production\n"
    foreign.unlink()
    foreign.symlink_to(tmp_path / "elsewhere.conf")
    with pytest.raises(SlurmError, match="refusing to replace"):
        cluster.link_slurm_conf(cfg)


def test_write_configs_reports_changes_and_protects_the_password(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    first = cluster.write_configs(cfg)
    assert all(first.values())
    assert cluster.write_configs(cfg) == dict.fromkeys(first, False)
    assert (cfg.etc / "slurmdbd.conf").stat().st_mode & 0o777 == 0o600
    assert (cfg.directory / "db_password").stat().st_mode & 0o777 == 0o600
    assert os.access(cfg.etc / "task_prolog.sh", os.X_OK)
    assert os.access(cfg.etc / "requeue_nudge.sh", os.X_OK)
    assert "PMIxCollFence=ring" in (cfg.etc / "mpi.conf").read_text().splitlines()
    assert all(p.exists() for p in (cfg.directory / "fakegpu").iterdir())
    bigger = ClusterConfig(**{**cfg.__dict__, "nodes": 5})
    changed = cluster.write_configs(bigger)
    assert changed["slurm.conf"] and changed["gres.conf"] and not changed["slurmdbd.conf"]
    assert cluster.load_config(cfg.directory) == bigger


def test_requeue_nudge_quotes_its_paths_and_refuses_what_is_not_a_job_id(tmp_path: Path) -> None:
    # The watcher on a real requeued het job: tests/test_requeue_hold.py.
    cfg = ClusterConfig(directory=tmp_path / "a dir; $(true)", hostname="h")
    (cfg.directory / "log").mkdir(parents=True)
    script = tmp_path / "nudge.sh"
    script.write_text(render_requeue_nudge(cfg))
    assert "@" not in script.read_text().split("\nSCONTROL=", 1)[1].split("\nif ", 1)[0]
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    bad = subprocess.run(["sh", str(script), "--watch", "12; touch x"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "not a job id" in bad.stderr and not (tmp_path / "x").exists()
    # As the epilog of a job that is no het job's leader: returns at once and starts nothing.
    for env in ({"SLURM_JOB_ID": "5"}, {"SLURM_JOB_ID": "6", "SLURM_HET_JOB_ID": "5", "SLURM_HET_JOB_OFFSET": "1"},
                {"SLURM_JOB_ID": "5; x", "SLURM_HET_JOB_ID": "5", "SLURM_HET_JOB_OFFSET": "0"}):
        done = subprocess.run(["sh", "-x", str(script)], env=env, capture_output=True, text=True)
        traced = done.stderr.split("MAX_WAIT_S=", 1)[1]  # what ran after the settings
        assert done.returncode == 0 and "setsid" not in traced, (env, done.stderr)
    assert not (cfg.directory / "log" / "requeue_nudge.log").exists()


def test_liveness_checks_the_executable_not_just_the_pid(tmp_path: Path) -> None:
    me = os.getpid()
    assert process_matches(me, sys.executable)
    assert not process_matches(me, "/usr/sbin/slurmd")  # a stale pid file naming us is not slurmd
    assert not process_matches(None, sys.executable)
    assert me in find_pids(sys.executable)
    (tmp_path / "x.pid").write_text("garbage\n")
    assert read_pid(tmp_path / "x.pid") is None
    assert read_pid(tmp_path / "missing.pid") is None


def test_status_and_down_without_a_cluster(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    st = cluster.status(cfg)
    assert st.config is None and not st.healthy and "no local cluster" in (st.error or "")
    assert cluster.down(cfg) == []


def test_cli_explains_a_bad_shape_without_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hetrun.cli", "cluster", "up", "--nodes", "0", "--no-install"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == SlurmError.exit_code
    assert "nodes=0" in proc.stderr and "Traceback" not in proc.stderr

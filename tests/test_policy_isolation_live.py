"""The policy's ``cpu.isolation: numa-aware`` and ``gpu.sharing`` running for real, on
throw-away clusters started the `hetrun cluster up --policy FILE` way
(tests/second_cluster.py with their own names, directories and ports).

Isolation cluster (hriso): 2 nodes x 2 CPUs as 2 sockets (at most the host's CPUs:
the cpuset cgroup and task/affinity map node CPUs onto real ones), task/cgroup +
task/affinity + proctrack/cgroup and the cgroup.conf rendered for the host's cgroup
version. Jobs read their own confinement from inside (/proc/self/status, the job's
cgroup files); a job over its memory is killed by the memory cgroup; a task bound
by the policy's autobind=sockets sits on one socket; the devices cgroup lets a job
open only its own (fake) GPU.

Shard cluster (hrshard): 1 node x 4 CPUs, 1 GPU with ``shards_per_gpu: 3``: three
``--gres=shard:1`` jobs run at once on the one GPU, the fourth waits for a shard
while a CPU is still free.

Slurm (with --enable-multiple-slurmd, as Debian builds it) names each node's
cgroups /slurm_<node>/ under every v1 controller; stop() removes the empty ones
it leaves behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hetrun.slurm_plugin.policy.apply import plan_live, slurm_runner
from hetrun.slurm_plugin.policy.isolation import CGROUP_ROOT, detect_cgroup
from hetrun.slurm_plugin.policy.model import load_policy
from second_cluster import SecondCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ISOLATION_POLICY = """\
resources:
  gpu: {count: 4}
  cpu: {cores: 4, memory: 2Gi, isolation: numa-aware}
"""
SHARD_POLICY = """\
resources:
  gpu: {count: 1, sharing: {shards_per_gpu: 3}}
  cpu: {cores: 4}
"""

# Run inside a job: what the job sees of its own confinement, as JSON.
PROBE = r'''
import errno, json, os, sys

def cgroup(ctrl):
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        if ctrl in ctrls.split(","):
            return path
    return ""

def job_dir(ctrl):
    parts = cgroup(ctrl).split("/")
    at = next((i for i, p in enumerate(parts) if p.startswith("job_")), None)
    return None if at is None else f"/sys/fs/cgroup/{ctrl}" + "/".join(parts[:at + 1])

def read(path):
    try:
        return open(path).read().strip()
    except (OSError, TypeError) as exc:
        return f"unreadable: {exc}"

def try_open(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return "opened"
    except OSError as exc:
        return errno.errorcode[exc.errno]

status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({
    "job": os.environ.get("SLURM_JOB_ID"), "task": os.environ.get("SLURM_PROCID"),
    "cpus_allowed": status["Cpus_allowed_list"].strip(),
    "cpuset_cgroup": cgroup("cpuset"),
    "job_cpuset": read(f"{job_dir('cpuset')}/cpuset.cpus"),
    "job_mem_limit": read(f"{job_dir('memory')}/memory.limit_in_bytes"),
    "gpus": os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS"),
    "open": {os.path.basename(p): try_open(p) for p in sys.argv[1:]},
}), flush=True)
'''


def _remove_node_cgroups(nodes: list[str]) -> None:
    for ctrl in CGROUP_ROOT.iterdir():
        for node in nodes:
            top = ctrl / f"slurm_{node}"
            if top.is_dir():
                for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                    with contextlib.suppress(OSError):  # still in use: leave it
                        os.rmdir(dirpath)


class IsolationCluster(SecondCluster):
    name = "hriso"
    directory = Path("/var/lib/hetrun-hriso")
    ctld_port = 16847
    first_node_port = 20001

    def stop(self) -> None:
        super().stop()
        _remove_node_cgroups(self.cfg.node_names)


class ShardCluster(SecondCluster):
    name = "hrshard"
    directory = Path("/var/lib/hetrun-hrshard")
    ctld_port = 16857
    first_node_port = 20011


def _start(cls: type[SecondCluster], text: str, factory: pytest.TempPathFactory,
           **shape: Any) -> Iterator[SecondCluster]:
    path = factory.mktemp("policy") / "policy.yaml"
    path.write_text(text)
    c = cls(policy=path, **shape)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def iso(slurm_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondCluster]:
    if not detect_cgroup().usable:
        pytest.skip(f"no usable cgroups on this host: {detect_cgroup()}")
    yield from _start(IsolationCluster, ISOLATION_POLICY, tmp_path_factory, nodes=2, cpus=2, sockets=2)


def _can_make_char_devices(where: Path) -> bool:
    """Shards need the fake GPUs as character devices (mknod: root with CAP_MKNOD)."""
    probe = where / "probe-dev"
    try:
        os.mknod(probe, 0o600 | stat.S_IFCHR, os.makedev(120, 0))
    except OSError:
        return False
    probe.unlink()
    return True


@pytest.fixture(scope="module")
def shards(slurm_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondCluster]:
    if not _can_make_char_devices(tmp_path_factory.mktemp("mknod")):
        pytest.skip("cannot create character devices here (mknod needs root with CAP_MKNOD)")
    yield from _start(ShardCluster, SHARD_POLICY, tmp_path_factory, nodes=1, cpus=4, gpus=1)


def _probe(dirpath: Path) -> Path:
    path = dirpath / "probe.py"
    path.write_text(PROBE)
    return path


def _srun(c: SecondCluster, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = c.run("srun", "-w", "n1", "-N1", *args, check=False)
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, sorted(rows, key=lambda r: int(r["task"] or 0)), proc.stderr


def test_the_nodes_run_the_policys_cgroup_settings(iso: SecondCluster) -> None:
    config = {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in
              iso.run("scontrol", "show", "config").stdout.splitlines())}
    assert config["ProctrackType"] == "proctrack/cgroup" and config["TaskPlugin"] == "task/cgroup,task/affinity"
    assert "autobind=sockets" in config["TaskPluginParam"].lower(), config["TaskPluginParam"]
    version = detect_cgroup().version
    assert f"CgroupPlugin=cgroup/{version}" in (iso.cfg.etc / "cgroup.conf").read_text()
    assert config["CgroupPlugin"] == f"cgroup/{version}" and config["ConstrainCores"] == "yes", config
    plan, _ = plan_live(load_policy(iso.cfg.policy or ""), slurm_runner(iso.env))
    assert plan.problems == [] and plan.by_kind("slurm.conf") == [], plan.changes


def test_concurrent_jobs_are_confined_to_their_own_cores(iso: SecondCluster, shared_tmp: Path) -> None:
    probe = _probe(shared_tmp)
    # Each job waits until both have started, so the two cpusets are held at once.
    script = shared_tmp / "job.sh"
    script.write_text(f"#!/bin/sh\ntouch {shared_tmp}/up.$SLURM_JOB_ID\n"
                      f"i=0; while [ $(ls {shared_tmp} | grep -c '^up\\.') -lt 2 ] && [ $i -lt 240 ]; do "
                      "sleep 0.5; i=$((i+1)); done\n"
                      f"ls {shared_tmp} | grep -c '^up\\.' > {shared_tmp}/seen.$SLURM_JOB_ID\n"
                      f"exec {sys.executable} {probe}\n")
    ids = [iso.run("sbatch", "--parsable", "-w", "n1", "-n1", "-c1", "--mem=100",
                   "-o", f"{shared_tmp}/out.%j", str(script)).stdout.strip() for _ in range(2)]
    deadline = time.monotonic() + 180
    while any((shared_tmp / f"out.{j}").stat().st_size == 0 if (shared_tmp / f"out.{j}").exists() else True
              for j in ids) and time.monotonic() < deadline:
        time.sleep(1)
    rows = [json.loads((shared_tmp / f"out.{j}").read_text().splitlines()[-1]) for j in ids]
    assert [(shared_tmp / f"seen.{j}").read_text().strip() for j in ids] == ["2", "2"], "not concurrent"
    cpus = [r["cpus_allowed"] for r in rows]
    assert all(c in ("0", "1") for c in cpus) and cpus[0] != cpus[1], rows
    # The confinement is the job's cgroup, not only an affinity mask.
    assert [r["job_cpuset"] for r in rows] == cpus, rows
    assert all(r["cpuset_cgroup"].startswith(f"/slurm_n1/uid_{os.getuid()}/job_") for r in rows), rows


def test_memory_over_the_jobs_request_is_killed(iso: SecondCluster, shared_tmp: Path) -> None:
    rc, rows, err = _srun(iso, "-n1", "-c1", "--mem=100", sys.executable, str(_probe(shared_tmp)))
    assert rc == 0 and rows[0]["job_mem_limit"] == str(100 << 20), (rows, err)
    touch = "import sys; b = b'x' * (int(sys.argv[1]) << 20); print('alive', len(b) >> 20)"
    rc, _, err = _srun(iso, "-n1", "-c1", "--mem=100", sys.executable, "-c", touch, "30")
    assert rc == 0, err
    rc, _, err = _srun(iso, "-n1", "-c1", "--mem=100", sys.executable, "-c", touch, "300")
    assert rc != 0 and "Out Of Memory" in err, err


def test_numa_aware_binds_each_task_to_one_socket(iso: SecondCluster, shared_tmp: Path) -> None:
    # No --cpu-bind type: the policy's TaskPluginParam=autobind=sockets decides.
    rc, rows, err = _srun(iso, "-n2", "--mem=100", "--cpu-bind=verbose", sys.executable, str(_probe(shared_tmp)))
    assert rc == 0, err
    assert sorted(r["cpus_allowed"] for r in rows) == ["0", "1"], rows
    assert err.count("cpu-bind=MASK") == 2, err
    log = (iso.cfg.directory / "log" / "slurmd-n1.log").read_text()
    assert f"JobId={rows[0]['job']} implicit auto binding: verbose,sockets" in log


def test_a_job_opens_only_its_own_gpu(iso: SecondCluster, shared_tmp: Path) -> None:
    files = [str(p) for p in sorted((iso.cfg.directory / "fakegpu").iterdir())]
    rc, rows, err = _srun(iso, "-n1", "-c1", "--mem=100", "--gres=gpu:1", sys.executable,
                          str(_probe(shared_tmp)), *files)
    assert rc == 0, err
    # Allowed by the devices cgroup (no driver behind the fake: ENXIO); the other is denied.
    opened = rows[0]["open"]
    assert sorted(opened.values()) == ["ENXIO", "EPERM"], rows
    if rows[0]["gpus"] is not None:  # Slurm's own word on which GPU the step has
        assert opened[f"gpu{rows[0]['gpus']}"] == "ENXIO", rows


def _squeue(c: SecondCluster) -> dict[str, tuple[str, str]]:
    out = c.run("squeue", "-h", "-o", "%i %T %r").stdout
    return {p[0]: (p[1], p[2]) for p in (ln.split() for ln in out.splitlines()) if len(p) == 3}


def test_shard_jobs_share_one_gpu_and_the_next_waits(shards: SecondCluster, shared_tmp: Path) -> None:
    node = shards.run("scontrol", "show", "node", "n1").stdout
    assert "Gres=gpu:1,shard:3" in node, node
    script = shared_tmp / "job.sh"
    script.write_text(f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES $SLURM_SHARDS_ON_NODE\" > {shared_tmp}/gpu.$SLURM_JOB_ID\n"
                      f"i=0; while [ ! -e {shared_tmp}/release ] && [ $i -lt 240 ]; do sleep 0.5; i=$((i+1)); done\n")
    ids = [shards.run("sbatch", "--parsable", "-w", "n1", "-c1", "--mem=50", "--gres=shard:1",
                      "-o", f"{shared_tmp}/out.%j", str(script)).stdout.strip() for _ in range(4)]
    deadline = time.monotonic() + 120
    while sum(1 for j in ids[:3] if (shared_tmp / f"gpu.{j}").exists()) < 3 and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(4)  # several scheduler passes (sched_interval=2): the fourth still waits
    states = _squeue(shards)
    assert [states[j][0] for j in ids[:3]] == ["RUNNING"] * 3, states
    assert states[ids[3]] == ("PENDING", "Resources"), states
    node = shards.run("scontrol", "show", "node", "n1").stdout
    assert "CPUAlloc=3 " in node and "CPUTot=4 " in node, node  # a CPU is free: the shard is what it waits for
    (shared_tmp / "release").touch()
    deadline = time.monotonic() + 120
    while any(j in _squeue(shards) for j in ids) and time.monotonic() < deadline:
        time.sleep(1)
    assert [(shared_tmp / f"gpu.{j}").read_text().split() for j in ids] == [["0", "1"]] * 4

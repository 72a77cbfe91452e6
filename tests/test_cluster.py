"""The real local Slurm cluster: idempotent up, status, a het job with MPI across nodes, sacct."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hetrun.slurm_plugin import cluster
from hetrun.slurm_plugin.cluster_conf import TASK_ENV

pytestmark = pytest.mark.slurm


def test_up_is_idempotent(slurm_cluster: cluster.ClusterStatus) -> None:
    before = {d.name: d.pid for d in slurm_cluster.daemons}
    again = cluster.up(install=False)
    after = {d.name: d.pid for d in again.daemons}
    assert again.healthy
    # Nothing was restarted: every daemon kept its pid.
    assert after == before
    assert all(pid for pid in after.values())


def test_up_restarts_only_what_is_down(slurm_cluster: cluster.ClusterStatus) -> None:
    cfg = slurm_cluster.config
    assert cfg is not None
    victim = f"slurmd-{cfg.node_names[-1]}"
    before = {d.name: d.pid for d in cluster.status().daemons}
    pid = before[victim]
    assert pid
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    down = {d.name: d.alive for d in cluster.status().daemons}
    assert down[victim] is False
    after = {d.name: d.pid for d in cluster.up(install=False).daemons}
    assert after[victim] and after[victim] != pid
    assert {k: v for k, v in after.items() if k != victim} == {
        k: v for k, v in before.items() if k != victim
    }


def test_status_lists_nodes_and_live_daemons(slurm_cluster: cluster.ClusterStatus) -> None:
    st = cluster.status()
    cfg = st.config
    assert cfg is not None
    assert [n.name for n in st.nodes] == cfg.node_names
    assert cfg.nodes >= 4
    for node in st.nodes:
        # Other tests may be running jobs: idle, mixed or allocated are all fine, down is not.
        assert node.state in cluster.USABLE_STATES, node
        assert node.cpus == cfg.cpus
        assert node.memory_mb == cfg.mem_mb
        assert node.gres.startswith(f"gpu:{cfg.gpus}") if cfg.gpus else node.gres == "(null)"
        assert node.partitions == ("debug", "high")
    names = {d.name for d in st.daemons}
    assert {"munged", "mariadb", "slurmdbd", "slurmctld"} <= names
    assert {f"slurmd-{n}" for n in cfg.node_names} <= names
    for d in st.daemons:
        assert d.alive and d.pid and Path(f"/proc/{d.pid}").exists(), d
    assert st.slurm_conf_linked
    # Plain Slurm clients find this cluster through /etc/slurm/slurm.conf.
    out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) == {"debug", "high"}


def test_cli_status_answers(slurm_cluster: cluster.ClusterStatus) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hetrun.cli", "cluster", "status"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("n1", "n4", "slurmctld", "slurmdbd", "munged", "slurmd-n1"):
        assert name in proc.stdout


MPI_PROBE = """\
import os
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
me = (comm.Get_rank(), os.environ["SLURMD_NODENAME"], os.environ.get("SLURM_HET_SIZE"),
      os.environ.get("OMPI_MCA_btl"), os.environ.get("OMPI_MCA_btl_tcp_if_include"))
everyone = comm.gather(me, root=0)
if comm.Get_rank() == 0:
    print("SIZE", comm.Get_size(), "SUM", total)
    for rank, node, het, btl, iface in everyone:
        print("RANK", rank, node, het, btl, iface)
"""


def _sacct_states(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-j", job_id, "-X", "-n", "-P", "--format=JobID,State"],
        capture_output=True, text=True, check=True,
    ).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_het_job_runs_mpi_across_nodes_and_sacct_shows_it(
    slurm_cluster: cluster.ClusterStatus, shared_tmp: Path
) -> None:
    probe = shared_tmp / "probe.py"
    probe.write_text(MPI_PROBE)
    out = shared_tmp / "het-%j.out"
    script = shared_tmp / "het.sbatch"
    # No OMPI_* settings and no SLURM_PMIX_FENCE here on purpose: the cluster's
    # TaskProlog and mpi.conf provide them for every job, not only hetrun's.
    show = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    assert re.search(r"PMIxCollFence\s*=\s*ring", show), show
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=hetrun-cluster-test\n"
        f"#SBATCH --output={out}\n"
        "#SBATCH --time=5\n"
        "#SBATCH --nodes=1 --ntasks=2 --cpus-per-task=1 --gres=gpu:2 --mem=400M\n"
        "#SBATCH hetjob\n"
        "#SBATCH --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=1 --mem=400M\n"
        # Slurm 22.05's srun sometimes outlives its finished het step (stuck in mpi/pmix,
        # ignoring SIGTERM; see test_stability_slurm.py; 1 job in 11 here, which then waited
        # out a 120 s bound): ended as hetrun's script's watchdog ends it, a few seconds after
        # the step has left squeue. A real MPI hang still fails below, since every rank's
        # line is checked.
        f"srun --mpi=pmix --het-group=0,1 {sys.executable} {probe} &\n"
        "pid=$!\n"
        "seen=0; gone=0; waited=0\n"
        'while kill -0 "$pid" 2>/dev/null; do\n'
        "    sleep 0.5; waited=$((waited + 1))\n"
        '    steps=$(squeue -h -s -j "$SLURM_JOB_ID" -o %i) || continue\n'
        '    if printf "%s\\n" "$steps" | grep -q "[.][0-9][0-9]*$"; then seen=1; gone=0; continue; fi\n'
        # A step never seen may still be starting: 60 s before it counts as gone.
        '    if [ "$seen" -eq 0 ] && [ "$waited" -lt 120 ]; then continue; fi\n'
        "    gone=$((gone + 1))\n"
        '    if [ "$gone" -ge 10 ]; then echo "srun outlived its step: ended" >&2; kill -s KILL "$pid"; fi\n'
        "done\n"
        'wait "$pid"; rc=$?\n'
        'if [ "$gone" -ge 10 ]; then rc=0; fi\n'
        "exit $rc\n"
    )
    env = {k: v for k, v in cluster.slurm_env().items() if not k.startswith(("OMPI_", "SLURM_JOB"))}
    proc = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True,
        timeout=60, env=env, cwd=shared_tmp, check=False,
    )
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    job_id = proc.stdout.strip().split(";")[0]
    # The job's end from accounting, polled every 0.5 s: `sbatch --wait` polls at 2, 10,
    # 42 s... after submit, so it sees a 20 s job at 42 s.
    live = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"}
    deadline = time.monotonic() + 300
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = _sacct_states(job_id)
        comps = [states.get(f"{job_id}+{i}", "PENDING").split()[0] for i in (0, 1)]
        if not any(c in live for c in comps):
            break
        time.sleep(0.5)
    log = Path(str(out).replace("%j", job_id))
    text = log.read_text() if log.exists() else "(no output file)"

    lines = text.splitlines()
    assert "SIZE 4 SUM 10" in lines, text
    ranks = [line.split() for line in lines if line.startswith("RANK")]
    assert len(ranks) == 4, text
    nodes = [r[2] for r in ranks]
    assert nodes[0] == nodes[1], "het group 0 is one node with both of its tasks"
    assert len(set(nodes)) == 3, f"4 ranks must span 3 emulated nodes, got {nodes}"
    for _, _, _, het, btl, iface in ranks:
        assert het == "2"
        assert btl == TASK_ENV["OMPI_MCA_btl"] and iface == "lo"

    # Accounting: both components are recorded as COMPLETED (slurmdbd lags a little),
    # which also says the batch script exited 0.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = _sacct_states(job_id)
        if states.get(f"{job_id}+0") == "COMPLETED" and states.get(f"{job_id}+1") == "COMPLETED":
            break
        time.sleep(1)
    assert states == {f"{job_id}+0": "COMPLETED", f"{job_id}+1": "COMPLETED"}, states


def _job_field(job_id: str, key: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    ).stdout
    for token in out.split():
        if token.startswith(key + "="):
            return token.split("=", 1)[1]
    return ""


def _wait_field(job_id: str, key: str, wanted: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    value = ""
    while time.monotonic() < deadline:
        value = _job_field(job_id, key)
        if value in wanted:
            return value
        time.sleep(0.5)
    return value


def test_high_partition_preempts_and_requeues_a_debug_job(
    slurm_cluster: cluster.ClusterStatus, shared_tmp: Path
) -> None:
    node = slurm_cluster.config.node_names[-1] if slurm_cluster.config else "n4"
    common = ["sbatch", "--parsable", "--time=5", f"--nodelist={node}", "--exclusive"]
    low = subprocess.run(
        [*common, "--partition=debug", "--requeue", "--job-name=hetrun-preempt-low",
         f"--output={shared_tmp}/low-%j.out", "--wrap", "echo started; sleep 300"],
        capture_output=True, text=True, check=True, cwd=shared_tmp,
    ).stdout.strip()
    high = ""
    try:
        assert _wait_field(low, "JobState", {"RUNNING"}, 120) == "RUNNING"
        high = subprocess.run(
            [*common, "--partition=high", "--job-name=hetrun-preempt-high",
             f"--output={shared_tmp}/high-%j.out", "--wrap", "echo high ran"],
            capture_output=True, text=True, check=True, cwd=shared_tmp,
        ).stdout.strip()
        assert _wait_field(high, "JobState", {"COMPLETED"}, 120) == "COMPLETED"
        # The preempted job went back to the queue, not away.
        assert _job_field(low, "JobState") in {"PENDING", "REQUEUED", "RUNNING"}
        assert int(_job_field(low, "Restarts") or 0) >= 1
        assert (shared_tmp / f"high-{high}.out").read_text().strip() == "high ran"
    finally:
        subprocess.run(["scancel", low, *([high] if high else [])], check=False)


@pytest.mark.skipif(
    not (os.environ.get("HETRUN_TEST_CLUSTER_RESTART") or os.environ.get("CI", "").lower() in ("1", "true", "yes")),
    reason="stops the shared cluster for a few seconds (other sessions' sbatch calls would fail): "
    "runs in CI, or with HETRUN_TEST_CLUSTER_RESTART=1",
)
def test_down_stops_what_up_started_and_up_brings_it_back(slurm_cluster: cluster.ClusterStatus) -> None:
    before = cluster.status()
    ours = {d.name: d.pid for d in before.daemons if d.ours and d.alive}
    foreign = {d.name: d.pid for d in before.daemons if not d.ours and d.alive}
    stopped = cluster.down()
    try:
        assert set(stopped) == set(ours)
        after = {d.name: d for d in cluster.status().daemons}
        for name in ours:
            assert not after[name].alive, f"{name} still runs after down()"
        for name, pid in foreign.items():
            assert after[name].pid == pid and after[name].alive, f"{name} was not ours: must keep running"
        assert cluster.status().error  # no controller to ask
    finally:
        again = cluster.up(install=False)
    assert again.healthy
    assert {d.name for d in again.daemons if d.alive} == {d.name for d in before.daemons}


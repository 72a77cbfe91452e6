"""Quota left on a real Slurm cluster that enforces limits: the second, throw-away cluster
(tests/second_cluster.py) with two GPU types (n1 gpu:a100, n2 gpu:v100, 2 each) and the
policy's team ``hrtest2_team`` holding a GPU quota of 3 (GrpTRES gres/gpu=3, applied with
sacctmgr at start; AccountingStorageEnforce=limits). Placement reads the limit from Slurm
(sacctmgr), what is in use from squeue; a component over it only with what runs now still goes,
waiting (Slurm queues it until the quota frees). One over it alone (refused) is a unit test: no
single node here can hold more than the quota.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin import placement_fit
from second_cluster import SecondCluster, policy_text

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ACCOUNT = "hrtest2_team"
JOB = """\
name: quota-live
components:
  trainer:
    nodes: 1
    gpus_per_node: 2
    mem: 200M
    placement: auto
    command: [sleep, "30"]
slurm: {account: hrtest2_team, time: "00:05:00"}
"""


@pytest.fixture(scope="module")
def cluster(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondCluster]:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(policy_text(3))
    c = SecondCluster(nodes=2, policy=path, gpu_types=("a100", "v100"))
    try:
        c.start()
        yield c
    finally:
        c.stop()  # also deletes the hrtest2_* QOS from the shared slurmdbd


def running(c: SecondCluster, job_id: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        jobs = json.loads(c.run("squeue", "--json", check=False).stdout or "{}").get("jobs", [])
        job = next((j for j in jobs if str(j.get("job_id")) == job_id), {})
        if job.get("job_state") == "RUNNING":
            return job
        time.sleep(1)
    raise AssertionError(f"job {job_id} not running after {timeout} s: {job.get('job_state')} {job.get('state_reason')}")


def test_the_teams_quota_left_is_read_from_slurm(cluster: SecondCluster, shared_tmp: Path) -> None:
    held = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "-A", ACCOUNT, "-p", "gpu-v100",
                       "--gres=gpu:v100:2", "--mem=100M", "-t", "10", "--wrap", "sleep 300").stdout.strip()
    try:
        assert running(cluster, held)["nodes"] == "n2"
        run, test_only = placement_fit.with_runner_env(cluster.env)
        (shared_tmp / "job.yaml").write_text(JOB)
        # 2 of 3 in use and 2 more asked: Slurm would queue it until the held job ends, so it still goes, waiting.
        waiting = placement_fit.choose(load_spec(shared_tmp / "job.yaml"), run=run, test_only=test_only)
        best = waiting.components["trainer"].best
        assert not best.fits_now and (f"over quota: account {ACCOUNT} has 2 of 3 GPUs in use, this needs 2: "
                                      "Slurm holds it until the quota frees") in best.reasons, best.reasons
        (shared_tmp / "job.yaml").write_text(JOB.replace("gpus_per_node: 2", "gpus_per_node: 1"))
        report = placement_fit.choose(load_spec(shared_tmp / "job.yaml"), run=run, test_only=test_only)
        best = report.components["trainer"].best  # 3 of 3 with it: inside the quota, at its brim
        assert f"quota: account {ACCOUNT} at 3 of 3 GPUs with it (100%)" in best.reasons, best.reasons
        assert best.nodes == ["n1"], best  # v100's n2 is the held job's
        lines = placement_fit.explain_lines(report)
        assert f"  account {ACCOUNT}: 2 of 3 GPUs in use" in lines, lines
    finally:
        cluster.run("scancel", "-u", "root", check=False)

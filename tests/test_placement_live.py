"""placement: auto on a real Slurm cluster with two GPU types: with the a100 node busy,
`hetrun submit` places an auto component on the idle v100 node, renders
--gres=gpu:v100:N and that type's partition, records why in plan.json, and
slurmctld runs it there.

The shared test cluster has one untyped GPU kind, so this runs on the second,
throw-away cluster (tests/second_cluster.py) shaped with two GPU types: n1 with
gpu:a100 (partition gpu-a100), n2 with gpu:v100 (gpu-v100), debug and high over both.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.submit import submit_spec
from second_cluster import SecondCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOB = """\
name: fit-live
components:
  trainer:
    nodes: 1
    gpus_per_node: 1
    mem: 200M
    placement: auto
    command: [sleep, "30"]
slurm: {time: "00:05:00"}
"""


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[SecondCluster]:
    c = SecondCluster(nodes=2, gpu_types=("a100", "v100"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def wait_for(c: SecondCluster, job_id: str, states: tuple[str, ...], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        # Slurm 22.05's squeue --json lists every job whatever -j says: pick ours.
        jobs = json.loads(c.run("squeue", "--json", check=False).stdout or "{}").get("jobs", [])
        job = next((j for j in jobs if str(j.get("job_id")) == job_id), {})
        if job.get("job_state") in states:
            return job
        time.sleep(1)
    raise AssertionError(f"job {job_id} not {states} after {timeout} s: {job.get('job_state')}")


def test_auto_component_lands_on_the_idle_gpu_type(cluster: SecondCluster, shared_tmp: Path) -> None:
    words = cluster.run("sinfo", "-h", "-N", "-o", "%N %G").stdout.split()  # a line per node and partition
    assert dict(zip(words[::2], words[1::2], strict=True)) == {"n1": "gpu:a100:2", "n2": "gpu:v100:2"}, words
    busy = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "-p", "gpu-a100", "--gres=gpu:a100:2",
                       "--mem=100M", "-t", "10", "--wrap", "sleep 300").stdout.strip()
    try:
        assert wait_for(cluster, busy, ("RUNNING",))["nodes"] == "n1"
        (shared_tmp / "job.yaml").write_text(JOB)
        spec = load_spec(shared_tmp / "job.yaml")
        result = submit_spec(spec, backend=SbatchBackend(env=cluster.env), runs_dir=shared_tmp / "runs",
                             plan=build_plan(spec), job_dir=shared_tmp)
        choice = json.loads((Path(result.run.run_dir) / "plan.json").read_text())["components"][0]["placement"]
        assert choice["gres"] == "gpu:v100" and choice["nodes"] == ["n2"], choice
        assert any("gpu:a100" in o and "would wait" in o for o in choice["others"]), choice["others"]
        assert "#SBATCH --gres=gpu:v100:1" in result.script
        assert f"#SBATCH --partition={choice['partition']}" in result.script
        job_id = result.run.job_id.split(";")[0]
        job = wait_for(cluster, job_id, ("RUNNING", "COMPLETED", "FAILED"))
        assert (job["nodes"], job["partition"]) == ("n2", choice["partition"]), {k: job.get(k) for k in (
            "job_id", "name", "nodes", "partition", "tres_per_node", "job_state")}
        assert "gpu:v100" in json.dumps(job.get("tres_per_node") or job.get("tres_req_str")), job
    finally:
        cluster.run("scancel", "-u", "root", check=False)


# JOB, short, with the YAML's fixed partition (high) that an auto component must not keep.
RESUMED_JOB = (JOB.replace("name: fit-live", "name: fit-resume").replace('[sleep, "30"]', '[sleep, "1"]')
               .replace("    placement: auto\n", "    placement: auto\n    partitions: [debug]\n")
               .replace("slurm: {time", "slurm: {partition: high, time"))


def test_resume_places_auto_components_again(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """`hetrun resume` (and resubmit) re-plans the job from its YAML: an auto component is placed again against
    the pool of now (its only allowed partition, debug), not sent back to the YAML's fixed partition (high).
    One allowed partition keeps it independent of queue pressure: with debug and high both
    allowed, other jobs pending on debug make high win."""
    from tests.cli_helpers import hetrun_cli, submit_yaml_and_wait

    sub, run_dir = submit_yaml_and_wait(shared_tmp, RESUMED_JOB)
    assert "hetrun: placed trainer on debug" in sub.stderr, sub.stderr
    res = hetrun_cli("resume", str(run_dir), "--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hetrun: placed trainer on debug" in res.stderr, res.stderr
    assert "#SBATCH --partition=debug" in res.stdout and "#SBATCH --partition=high" not in res.stdout, res.stdout



# Four ranks of one CPU: no node of the shared cluster (2 CPUs) holds them, two nodes of two ranks do.
SPREAD_JOB = """\
name: fit-spread
components:
  trainer:
    nodes: 1
    tasks_per_node: 4
    mem: 200M
    placement: auto
    node_counts: [1, 2]
    command: [sleep, "1"]
slurm: {time: "00:05:00"}
"""


def test_node_count_chosen_at_submit_is_what_slurm_runs(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.cli_helpers import hetrun_cli, submit_yaml_and_wait

    _sub, run_dir = submit_yaml_and_wait(shared_tmp, SPREAD_JOB)
    comp = json.loads((run_dir / "plan.json").read_text())["components"][0]
    assert (comp["nodes"], comp["tasks_per_node"], comp["ntasks"], comp["mem_mb"]) == (2, 2, 4, 100), comp
    assert comp["placement"]["node_count"] == 2
    assert any("x1 nodes: nodes have 2 CPUs / 2 GPUs, 4 / 0 needed" in o for o in comp["placement"]["others"])
    script = (run_dir / "hetjob.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script, script
    job_id = json.loads((run_dir / "run.json").read_text())["job_id"].split(";")[0].split("+")[0]
    acct = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "--format=NNodes,NCPUS,State"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    assert acct and acct[0].startswith("2|"), acct  # Slurm gave it two nodes
    res = hetrun_cli("resume", str(run_dir), "--dry-run")  # re-placed from job.yaml's own shape, as at submit
    assert res.returncode == 0, res.stdout + res.stderr
    assert "#SBATCH --nodes=2" in res.stdout and "#SBATCH --ntasks-per-node=2" in res.stdout, res.stdout

"""placement: ranked on the shared Slurm cluster: `hetrun submit` hands Slurm both allowed
partitions best first as one --partition list, Slurm runs the job in one of them (sacct's
partition), `hetrun report` shows the ranked list and where Slurm ran it, and `hetrun resume`
ranks again against the pool of now."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RANKED_JOB = """\
name: ranked-live
components:
  trainer:
    nodes: 1
    gpus_per_node: 1
    mem: 200M
    placement: ranked
    partitions: [debug, high]
    command: [sleep, "1"]
slurm: {time: "00:05:00"}
"""


def test_a_ranked_component_runs_from_a_partition_list(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.cli_helpers import hetrun_cli, submit_yaml_and_wait

    sub, run_dir = submit_yaml_and_wait(shared_tmp, RANKED_JOB)
    choice = json.loads((run_dir / "plan.json").read_text())["components"][0]["placement"]
    ranked = choice["ranked"]
    assert sorted(ranked) == ["debug", "high"] and ranked[0] == choice["partition"], choice
    assert choice["gres"] == "gpu"  # the shared cluster's GPUs are untyped
    assert f"hetrun: placed trainer on {','.join(ranked)} gpu" in sub.stderr, sub.stderr
    script = (run_dir / "hetjob.sbatch").read_text()
    assert f"#SBATCH --partition={','.join(ranked)}\n" in script and "#SBATCH --gres=gpu:1\n" in script, script
    job_id = json.loads((run_dir / "run.json").read_text())["job_id"].split(";")[0].split("+")[0]
    acct: list[str] = []
    for _ in range(60):  # slurmdbd may record the job before its partition: wait for the full row
        acct = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "--format=Partition,State"],
                              capture_output=True, text=True, timeout=60).stdout.split()
        if acct and not acct[0].startswith("|"):
            break
        time.sleep(1)
    assert acct and acct[0].split("|")[0] in ranked and "COMPLETED" in acct[0], acct  # Slurm ran it in one of them
    rep = hetrun_cli("report", str(run_dir))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert f"placed trainer on {','.join(ranked)} gpu" in rep.stdout, rep.stdout
    assert f"Slurm ran trainer (sacct, job {job_id})" in rep.stdout, rep.stdout
    res = hetrun_cli("resume", str(run_dir), "--dry-run")  # ranked again from job.yaml against the pool of now
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hetrun: placed trainer on " in res.stderr and "(ranked: Slurm starts it" in res.stderr, res.stderr
    assert "#SBATCH --partition=debug,high" in res.stdout or "#SBATCH --partition=high,debug" in res.stdout

"""The policy's tiers preempting for real, on a second throw-away cluster
(tests/second_cluster.py) started the way `hetrun cluster up --policy FILE` starts
one: slurm.conf rendered with the policy's settings and job_submit.lua, then its
QOS/accounts applied through sacctmgr.

- starting with the policy leaves nothing for `apply` to do (idempotent);
- a hetrun job in the default (normal) tier is preempted by a plain sbatch job of
  the critical tier through preempt/qos: Slurm requeues it (PreemptMode=requeue
  on the QOS), the job starts again and hetrun's resume restores its checkpoint
  (restore event with restored_state) and finishes;
- the policy's time_slicing is on (PreemptMode=REQUEUE,GANG): the preemption above
  runs under it. Two whole-node jobs taking turns on the time-sliced partition is
  tests/test_pool_big.py's (the same check ran here too, 15 s of the suite).

Job ids restart at 1 on every fresh start of this cluster while the shared
slurmdbd keeps the records of earlier lives under the same ids: look jobs up
with squeue (this life only), never ``sacct -j`` by id alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.cluster import apply_policy_objects
from hetrun.slurm_plugin.policy.apply import plan_live, slurm_runner
from hetrun.slurm_plugin.policy.model import load_policy
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from second_cluster import SecondCluster, policy_text

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
HERE = Path(__file__).parent
ACCOUNT = "hrtest2_team"

POLICY = policy_text(4, 'time_slicing: {partition: high, max_wall: "00:05:00", jobs_per_core: 2, slice_seconds: 5}\n')


@pytest.fixture(scope="module")
def cluster(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondCluster]:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    c = SecondCluster(policy=path)
    try:
        c.start()
        yield c
    finally:
        c.stop()  # also deletes the hrtest2_* QOS from the shared slurmdbd


def _env(c: SecondCluster) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(c.cfg.slurm_conf)}


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def _job(c: SecondCluster, job_id: str) -> dict[str, Any]:
    jobs = json.loads(c.run("squeue", "--json", "-j", job_id, check=False).stdout or "{}").get("jobs") or []
    return jobs[0] if jobs else {}


def test_starting_with_the_policy_leaves_nothing_to_apply(cluster: SecondCluster) -> None:
    assert cluster.policy_commands, "the QOS and accounts were created at start"
    config = cluster.run("scontrol", "show", "config").stdout
    assert "PreemptType             = preempt/qos" in config
    assert "JobSubmitPlugins        = lua" in config
    plan, _ = plan_live(load_policy(cluster.cfg.policy or ""), slurm_runner(cluster.env))
    assert plan.changes == [], [(c.kind, c.target, c.fields) for c in plan.changes]
    assert apply_policy_objects(cluster.cfg) == []
    qos = cluster.run("sacctmgr", "-n", "-P", "show", "qos", "hrtest2_critical",
                      "format=Name,Preempt,PreemptMode").stdout.strip()
    assert qos == "hrtest2_critical|hrtest2_high,hrtest2_normal|requeue", qos


def test_a_critical_job_preempts_a_normal_hetrun_job_which_resumes(cluster: SecondCluster, shared_tmp: Path) -> None:
    job_dir = shared_tmp / "job"
    job_dir.mkdir()
    (job_dir / "resume_workload.py").write_text((HERE / "test_resume_workload.py").read_text())
    spec = spec_from_dict({
        "name": "tier-probe", "workload": "resume_workload:ResumeProbe", "workload_args": {"sleep": 0.3},
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "300M",
                                   "actions": ["forward", "backward", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": 24, "micro_batches": 1, "pipeline_window": 1, "seed": 3},
        "checkpoint": {"interval": 4, "keep": 3},
        "preemption": {"signal": "USR1", "grace_seconds": 30, "max_restarts": 2},
        # No QOS: the policy's job_submit.lua gives the account's default tier.
        "slurm": {"partition": "debug", "account": ACCOUNT, "time": "00:10:00", "extra": ["--nodelist=n1"]},
        "env": {"OMP_NUM_THREADS": "1", "HETRUN_JOB_DIR": str(job_dir)},
    })
    backend = SbatchBackend(env=_env(cluster))
    res = submit_spec(spec, backend=backend, runs_dir=shared_tmp / "runs")
    run_dir, job_id = Path(res.run.run_dir), str(res.run.job_id)
    preemptor = ""
    try:
        assert wait_for(lambda: any(e.get("ev") == "action" and e.get("iteration", -1) >= 6
                                    for e in _events(run_dir)), 180), _events(run_dir)[-5:]
        assert _job(cluster, job_id)["qos"] == "hrtest2_normal"
        # A plain sbatch user naming the tier: the lua maps `critical` onto its QOS.
        preemptor = cluster.run("sbatch", "--parsable", "-A", ACCOUNT, "--qos=critical", "-p", "debug",
                                "-w", "n1", "--exclusive", "-t", "00:02:00", "-J", "critical-probe",
                                f"--output={shared_tmp}/critical-%j.out", "--wrap", "sleep 3",
                                ).stdout.strip().split(";")[0]

        def restored() -> bool:
            return any(e.get("ev") == "restore" and e.get("restart_count") == 1 and e.get("restored_state")
                       for e in _events(run_dir))

        assert wait_for(restored, 240), (_events(run_dir)[-8:], _job(cluster, job_id).get("state_reason"))
        final = wait_for_end(res.run, backend, timeout_s=300, poll_s=1)
        assert [c.state for c in final.components] == ["COMPLETED"], final
        assert [c.restarts for c in final.components] == [1], final
    finally:
        cluster.run("scancel", job_id, *([preemptor] if preemptor else []), check=False)
    sacct = cluster.run("sacct", "-n", "-P", "-X", "-j", preemptor, "--format=QOS,State").stdout.split()
    assert sacct == ["hrtest2_critical|COMPLETED"], sacct
    restore = next(e for e in _events(run_dir) if e.get("ev") == "restore" and e.get("restart_count") == 1)
    assert restore["step"] >= 4 and restore["restored_state"] is True, restore

"""The whole policy, live, on a second throw-away cluster (tests/second_cluster.py):
`policy apply --write-conf` switches it to preempt/qos + multifactor + job_submit/lua,
then real slurmctld decides:

- a job naming no tier gets the default tier's QOS (the lua, in slurmctld);
- a job over its account's quota is refused at submission with the policy's message;
- a second apply, slurm.conf included, changes nothing;
- plain sbatch/srun/salloc from a NON-root user (``nobody``, account
  hrtest2_vision with quota cpu=4 mem=1000M node=2 gpu=2) in every request
  shape: refused when over the quota, accepted when under (the lua reads
  Slurm's unset markers as unset and counts the memory Slurm will give,
  slurm.conf's DefMemPerCPU included).

A critical job preempting a normal hetrun job through preempt/qos, and time
slicing, are in tests/test_policy_preempt_live.py (a cluster started with the policy).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hetrun.slurm_plugin.policy.apply import apply_plan, plan_live
from hetrun.slurm_plugin.policy.model import load_policy
from hetrun.slurm_plugin.policy.state import Runner
from second_cluster import NAME, SecondCluster, policy_text

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# A second team of non-root users; ``nobody`` exists on every Debian/Ubuntu host.
POLICY = policy_text(2, "  hrtest2_vision:\n    quota: {cpu: 4, mem: 1000M, node: 2, gpu: 2}\n"
                        "    users: [nobody]\n")


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


def as_nobody(c: SecondCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to submit as a non-root user"
    return subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
                          env=c.env, capture_output=True, text=True, timeout=60, cwd="/",
                          stdin=subprocess.DEVNULL)


# The cluster: 2 nodes x 2 CPUs, 1000 MB each, DefMemPerCPU=250 in slurm.conf; hrtest2_vision's
# quota cpu=4 mem=1000M node=2 gres/gpu=2. (options, refused?, what a refusal names)
SHAPES = [
    ([], False, ""),
    (["-n1", "--qos=high"], False, ""),  # issue 21: was refused as cpu=65534
    (["-n4"], False, ""),  # 4 x DefMemPerCPU 250 = 1000M: at the quota, not over
    (["-n5"], True, "cpu=5 "),
    (["-c2"], False, ""),
    (["-c5"], True, "cpu=5 "),
    (["-n2", "-c2"], False, ""),
    (["-n3", "-c2"], True, "cpu=6 "),
    (["-N2"], False, ""),
    (["-N3"], True, "node=3 "),
    (["-N2", "-c2"], False, ""),
    (["-N2", "--ntasks-per-node=2"], False, ""),
    (["-N2", "--ntasks-per-node=3"], True, "cpu=6 "),
    (["--mem=900"], False, ""),
    (["--mem=1001"], True, "mem=1001M "),
    (["-N2", "--mem=501"], True, "mem=1002M "),
    (["-n3", "--mem-per-cpu=300"], False, ""),
    (["-n4", "--mem-per-cpu=300"], True, "mem=1200M "),
    (["-N2", "--gres=gpu:1"], False, ""),
    (["-N2", "--gres=gpu:2"], True, "gres/gpu=4 "),
    (["--gpus=3"], True, "gres/gpu=3 "),
    (["--array=0-3", "-n2"], False, ""),
    (["--array=0-1", "-n5"], True, "cpu=5 "),
    (["-n2", ":", "-n2"], False, ""),
    (["-n2", ":", "-n3"], True, "cpu=5 "),
]


def test_plain_submissions_from_a_non_root_user_in_every_shape(cluster: SecondCluster, applied: Path) -> None:
    wrong, accepted = [], []
    for opts, refused, names in SHAPES:
        # Options before the first ":" belong to the first het component; --hold and the rest to all.
        out = as_nobody(cluster, "sbatch", "--parsable", "--hold", "-A", "hrtest2_vision", "-D", "/",
                        "-o", "/dev/null", *opts, "--wrap", "sleep 1")
        if out.returncode == 0:
            accepted.append(out.stdout.strip().split(";")[0])
        if (out.returncode != 0) != refused or (refused and names not in out.stderr + " ") or (
                refused and "hetrun policy" not in out.stderr):
            wrong.append(f"  sbatch {' '.join(opts) or '(no options)'}: expected "
                         f"{'refused naming ' + names.strip() if refused else 'accepted'}, "
                         f"got rc={out.returncode} {out.stderr.strip()!r}")
    for tool, extra in (("srun", []), ("salloc", [])):
        ok = as_nobody(cluster, tool, "-A", "hrtest2_vision", "-n1", "-t", "1", *extra, "true")
        over = as_nobody(cluster, tool, "-A", "hrtest2_vision", "-n5", "-t", "1", *extra, "true")
        if ok.returncode != 0:
            wrong.append(f"  {tool} -n1: expected to run, got rc={ok.returncode} {ok.stderr.strip()!r}")
        if over.returncode == 0 or "cpu=5 but account hrtest2_vision's quota is GrpTRES cpu=4" not in over.stderr:
            wrong.append(f"  {tool} -n5: expected refused naming cpu=5, got rc={over.returncode} "
                         f"{over.stderr.strip()!r}")
    if accepted:
        cluster.run("scancel", *accepted, check=False)
    assert not wrong, "the policy's lua misreads these requests (as user nobody):\n" + "\n".join(wrong)

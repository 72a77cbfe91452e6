"""The 64-node pool (tests/big_cluster.py) with the policy, on real slurmctld, slurmdbd +
MariaDB, sacctmgr and the job_submit/lua plugin: issue 14's "Where it runs".

One pool start serves every test (start + stop cost about a minute). The pool comes
up the way `hetrun cluster up --policy FILE` brings a cluster up (slurm.conf with the
policy's settings, job_submit.lua), except that its QOS and accounts are left to the
test's own `hetrun policy apply`. Then, in this order (the module's state carries on):

- 64 idle nodes in their partitions; `hetrun pool --json` sees both GPU types;
- after `hetrun policy apply`, `sacctmgr show qos/assoc` matches the YAML, and a
  second apply changes nothing;
- plain `sbatch`: the lua gives the default tier, refuses a job over its team's
  quota with the policy's message, sends a short job naming no partition to the
  time-sliced one; Slurm refuses a tier the team may not use;
- short jobs time-slice on the policy's partition (the gang scheduler takes turns);
- with the 24 a100 nodes filled by normal-tier sleeps: `hetrun submit` places a
  `placement: auto` component on the idle v100 type; `hetrun pool --json` shows the
  pending demand and `hetrun policy status` the tiers' jobs; a critical job preempts
  and requeues one of the normal ones;
- with both GPU types full, hetrun's placement sends a critical job that accepts either to the
  partition whose preemption loses least (a checkpointing job's), naming that job's node, and
  Slurm preempts it there;
- with ``checkpointed: {spare_plain: true}`` applied, a critical job waits for plain jobs
  instead of preempting them, and preempts a checkpointing one.

cpu.isolation is ``none`` here: each emulated node claims 4 CPUs, and task/affinity
maps them onto real ones, so numa-aware needs a host with at least 4 (the last test
shows the refusal on a smaller one; tests/test_policy_isolation_live.py runs it on 2
small nodes). Start-up time and memory of this pool are in benchmarks/pool.md; tests
assert behaviour, never timings. Job ids restart at 1 in every life of the pool while
the shared slurmdbd keeps earlier lives' records: jobs are looked up with squeue only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from big_cluster import GPU_TYPES, BigPool
from hetrun.slurm_plugin.policy.isolation import detect_cgroup
from hetrun.slurm_plugin.rundir import wait_for

from hetrun.errors import SlurmError

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TEAM, BIG = "hrpool_vision", "hrpool_research"  # the quota'd team; a team without quota
TEAM_GPUS = 8
# The shape on this pool: 48 a100 + 48 v100 GPUs, 64 x 4 CPUs, 64 x 360 MB.
POLICY = f"""\
resources:
  gpu:
    type: ["V100", "A100"]
    count: 96
    scheduling:
      priority: ["critical", "high", "normal"]
      preemption: true
      checkpointed: {{}}
  cpu:
    cores: 256
    memory: 22Gi
    isolation: "none"
naming: {{qos_prefix: hrpool_}}
accounts:
  {BIG}:
    users: [root]
  {TEAM}:
    quota: {{gpu: {TEAM_GPUS}}}
    tiers: [high, normal]
    users: [root]
time_slicing: {{partition: cpu, max_wall: "00:05:00", jobs_per_core: 2, slice_seconds: 5}}
"""
A100_NODES = {f"n{i}" for i in range(1, 25)}
V100_NODES = {f"n{i}" for i in range(25, 49)}
FILLERS, FILLER_NODES = 4, 6  # 4 jobs x 6 nodes = the 24 a100 nodes
WHOLE_NODE = ("--ntasks-per-node=1", "-c4", "--mem-per-cpu=80M")


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture(scope="module")
def pool(slurm_cluster, policy_file: Path) -> Iterator[BigPool]:  # type: ignore[no-untyped-def]
    p = BigPool(policy=policy_file)
    p.apply_policy_at_start = False  # the QOS and accounts come from test's `hetrun policy apply`
    try:
        p.start()
        yield p
    finally:
        p.stop()  # also deletes the hrpool_* QOS from the shared slurmdbd


def cli(pool: BigPool, *args: str) -> subprocess.CompletedProcess[str]:
    """``hetrun ARGS`` as a user of the pool runs it (SLURM_CONF names the pool's slurm.conf)."""
    env = {**os.environ, "SLURM_CONF": str(pool.cfg.slurm_conf), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                          timeout=180, env=env, check=False)


@pytest.fixture(scope="module")
def applied(pool: BigPool, policy_file: Path) -> subprocess.CompletedProcess[str]:
    """The first `hetrun policy apply` on the pool (slurm.conf already holds the settings)."""
    proc = cli(pool, "policy", "apply", str(policy_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def sbatch(pool: BigPool, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return pool.run("sbatch", "--parsable", "-o", "/dev/null", *args, check=check)


def job_id(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout.strip().split(";")[0]


def jobs(pool: BigPool) -> dict[str, dict[str, Any]]:
    # Slurm 22.05's squeue --json lists every job whatever -j says.
    data = json.loads(pool.run("squeue", "--json", check=False).stdout or "{}")
    return {str(j["job_id"]): j for j in data.get("jobs") or []}


def test_sixty_four_nodes_come_up_idle_in_their_partitions(pool: BigPool) -> None:
    lines = pool.run("sinfo", "-h", "-N", "-o", "%N %P %T %G").stdout.split("\n")
    rows = [ln.split() for ln in lines if ln.strip()]
    by_partition: dict[str, set[str]] = {}
    for node, partition, state, _gres in rows:
        assert state == "idle", (node, state)
        by_partition.setdefault(partition.rstrip("*"), set()).add(node)
    assert len(by_partition["debug"]) == len(by_partition["high"]) == 64
    assert by_partition["gpu-a100"] == A100_NODES and by_partition["gpu-v100"] == V100_NODES
    assert len(by_partition["cpu"]) == 16
    assert not by_partition["cpu"] & (by_partition["gpu-a100"] | by_partition["gpu-v100"])


def test_hetrun_pool_json_lists_both_gpu_types(pool: BigPool) -> None:
    proc = cli(pool, "pool", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    gres = {(r["partition"], r["gres"]): r for r in rows}
    for gpu_type in GPU_TYPES:
        row = gres[(f"gpu-{gpu_type}", f"gpu:{gpu_type}")]
        assert (row["node_total"], row["gpus_total"], row["gpus_alloc"]) == (24, 48, 0)
        assert gres[("debug", f"gpu:{gpu_type}")]["gpus_total"] == 48
    assert gres[("cpu", "-")]["cpus_total"] == 16 * 4


def _sacctmgr(pool: BigPool, *args: str) -> list[list[str]]:
    return [ln.split("|") for ln in pool.run("sacctmgr", "-n", "-P", *args).stdout.splitlines() if ln]


def test_apply_makes_sacctmgr_match_the_yaml_and_a_second_apply_changes_nothing(
        pool: BigPool, policy_file: Path, applied: subprocess.CompletedProcess[str]) -> None:
    ran = [ln for ln in applied.stdout.splitlines() if ln.startswith("ran: sacctmgr")]
    assert any("add qos hrpool_critical" in ln for ln in ran), applied.stdout
    assert "not written" not in applied.stdout, "slurm.conf started with every setting the policy needs"
    # Tier i of n: Priority (n-i)*1000, Preempt every lower tier, requeued (docs/POLICY.md).
    # With checkpointed, each tier's <tier>_ckpt QOS sits 100 below it (no GraceTime set), and
    # every Preempt list names the lower tiers' _ckpt QOS too. Lists compared as sets.
    qos = {row[0]: [row[1], set(filter(None, row[2].split(","))), *row[3:]] for row in _sacctmgr(
        pool, "show", "qos", "format=Name,Priority,Preempt,PreemptMode,Flags,GraceTime")}
    lower_than_high = {"hrpool_normal", "hrpool_normal_ckpt"}
    lower_than_critical = {"hrpool_high", "hrpool_high_ckpt", *lower_than_high}
    assert qos["hrpool_critical"] == ["3000", lower_than_critical, "requeue", "DenyOnLimit", "00:00:00"]
    assert qos["hrpool_critical_ckpt"] == ["2900", lower_than_critical, "requeue", "DenyOnLimit", "00:00:00"]
    assert qos["hrpool_high"] == ["2000", lower_than_high, "requeue", "DenyOnLimit", "00:00:00"]
    assert qos["hrpool_high_ckpt"] == ["1900", lower_than_high, "requeue", "DenyOnLimit", "00:00:00"]
    assert qos["hrpool_normal"] == ["1000", set(), "requeue", "DenyOnLimit", "00:00:00"]
    assert qos["hrpool_normal_ckpt"] == ["900", set(), "requeue", "DenyOnLimit", "00:00:00"]
    assoc = {tuple(row[:2]): [row[2], set(row[3].split(",")), row[4]] for row in _sacctmgr(
        pool, "show", "assoc", "cluster=hrpool", "format=Account,User,GrpTRES,QOS,DefaultQOS")}
    team_qos = {"hrpool_high", "hrpool_high_ckpt", "hrpool_normal", "hrpool_normal_ckpt"}
    assert assoc[(TEAM, "")] == [f"gres/gpu={TEAM_GPUS}", team_qos, "hrpool_normal"]
    assert assoc[(TEAM, "root")][1:] == [team_qos, "hrpool_normal"]
    every_tier = {"hrpool_critical", "hrpool_critical_ckpt", *team_qos}
    assert assoc[(BIG, "")] == ["", every_tier, "hrpool_normal"]
    assert assoc[(BIG, "root")][1:] == [every_tier, "hrpool_normal"]

    again = cli(pool, "policy", "apply", str(policy_file))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "nothing to change", again.stdout
    plan = cli(pool, "policy", "plan", str(policy_file), "--json")
    assert json.loads(plan.stdout)["in_sync"] is True, plan.stdout


@pytest.mark.usefixtures("applied")
def test_plain_sbatch_gets_the_policy_from_the_lua(pool: BigPool) -> None:
    held = job_id(sbatch(pool, "--hold", "-A", TEAM, "-p", "gpu-v100", "--gres=gpu:2", "--wrap", "sleep 1"))
    short = job_id(sbatch(pool, "--hold", "-A", BIG, "-t", "2", "-n1", "--mem=50M", "--wrap", "sleep 1"))
    try:
        seen = jobs(pool)
        assert seen[held]["qos"] == "hrpool_normal", "no tier named: the team's default tier"
        assert seen[short]["partition"] == "cpu", "a 2-minute job naming no partition: the time-sliced one"
    finally:
        pool.run("scancel", held, short, check=False)
    over = sbatch(pool, "-A", TEAM, "-p", "gpu-v100", "-N5", "--gres=gpu:2", "--wrap", "sleep 1", check=False)
    assert over.returncode != 0
    assert f"job asks for gres/gpu=10 but account {TEAM}'s quota is GrpTRES gres/gpu={TEAM_GPUS}" in over.stderr
    # The lua maps `critical` onto its QOS; the team's association does not list it.
    barred = sbatch(pool, "-A", TEAM, "--qos=critical", "-p", "gpu-v100", "--wrap", "sleep 1", check=False)
    assert barred.returncode != 0 and "Invalid qos specification" in barred.stderr, barred.stderr


@pytest.mark.usefixtures("applied")
def test_short_jobs_time_slice_on_the_policys_partition(pool: BigPool) -> None:
    """Two jobs that each want all of n49's CPUs share them (OverSubscribe=FORCE:2) and the
    gang scheduler takes turns: each RUNNING while the other is SUSPENDED, both ways round."""
    assert "OverSubscribe=FORCE:2" in pool.run("scontrol", "show", "partition", "cpu").stdout
    ids = [job_id(sbatch(pool, "-A", BIG, "-p", "cpu", "-w", "n49", "-n1", "-c4", "--mem=150M", "-t", "3",
                         "--wrap", "sleep 120")) for _ in range(2)]
    seen: set[tuple[str, ...]] = set()

    def both_took_turns() -> bool:
        states = tuple(jobs(pool).get(i, {}).get("job_state", "") for i in ids)
        if sorted(states) == ["RUNNING", "SUSPENDED"]:
            seen.add(states)
        return len(seen) == 2

    try:
        assert wait_for(both_took_turns, 90), seen
    finally:
        pool.run("scancel", *ids, check=False)


@pytest.fixture(scope="module")
def a100_full(pool: BigPool, applied: object) -> list[str]:
    """The 24 a100 nodes held by normal-tier sleeps (no tier named: the lua's default)."""
    ids = [job_id(sbatch(pool, "-A", BIG, "-p", "gpu-a100", f"-N{FILLER_NODES}", *WHOLE_NODE,
                         "--gres=gpu:a100:2", "-t", "10", "--requeue", "-J", "fill-a100", "--wrap", "sleep 600"))
           for _ in range(FILLERS)]
    assert wait_for(lambda: all(jobs(pool).get(i, {}).get("job_state") == "RUNNING" for i in ids), 120), \
        {i: jobs(pool).get(i, {}).get("state_reason") for i in ids}
    assert {j["qos"] for i, j in jobs(pool).items() if i in ids} == {"hrpool_normal"}
    return ids


def _running(pool: BigPool, ids: list[str]) -> bool:
    seen = jobs(pool)
    return all(seen.get(i, {}).get("job_state") == "RUNNING" for i in ids)


PLACED_JOB = """\
name: fit-pool
components:
  trainer:
    nodes: 1
    gpus_per_node: 1
    mem: 200M
    placement: auto
    command: [sleep, "60"]
slurm: {time: "00:05:00"}
"""


def test_placement_auto_picks_the_idle_gpu_type(pool: BigPool, a100_full: list[str], shared_tmp: Path) -> None:
    assert _running(pool, a100_full)
    (shared_tmp / "job.yaml").write_text(PLACED_JOB)
    sub = cli(pool, "submit", str(shared_tmp / "job.yaml"), "--runs-dir", str(shared_tmp / "runs"))
    assert sub.returncode == 0, sub.stdout + sub.stderr
    placed = next(ln for ln in sub.stderr.splitlines() if ln.startswith("hetrun: placed trainer on "))
    partition, gres = placed.split()[4:6]
    assert gres == "gpu:v100", placed
    ident = next(ln for ln in sub.stdout.splitlines() if ln.startswith("submitted ")).split()[4].split(";")[0]
    try:
        assert wait_for(lambda: jobs(pool).get(ident, {}).get("job_state") == "RUNNING", 90), jobs(pool).get(ident)
        job = jobs(pool)[ident]
        assert job["nodes"] in V100_NODES and job["partition"] == partition, (job["nodes"], job["partition"])
    finally:
        pool.run("scancel", ident, check=False)


def test_pool_json_shows_pending_demand_and_policy_status_the_tiers(
        pool: BigPool, policy_file: Path, a100_full: list[str]) -> None:
    assert _running(pool, a100_full)
    waiting = job_id(sbatch(pool, "-A", BIG, "-p", "gpu-a100", "-N2", *WHOLE_NODE, "--gres=gpu:a100:2",
                            "-t", "5", "--wrap", "sleep 1"))
    try:
        assert wait_for(lambda: jobs(pool).get(waiting, {}).get("state_reason") not in (None, "None"), 30)
        snap = json.loads(cli(pool, "pool", "--json").stdout)
        pending = {p["partition"]: p for p in snap["pending"]}
        assert pending["gpu-a100"]["jobs"] == 1, snap["pending"]
        assert pending["gpu-a100"]["tres"]["gres/gpu"] == 4 and pending["gpu-a100"]["tres"]["node"] == 2
        row = next(r for r in snap["rows"] if (r["partition"], r["gres"]) == ("gpu-a100", "gpu:a100"))
        assert (row["gpus_alloc"], row["nodes"].get("allocated")) == (48, 24), row
        assert snap["running_jobs"] >= FILLERS  # the placement test's job may still be ending
        assert {BIG, TEAM} <= {a["account"] for a in snap["accounts"]}

        status = cli(pool, "policy", "status", str(policy_file))
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[0] == "in sync", status.stdout
        tiers = {ln.split()[0]: ln.split()[1:] for ln in lines[2:]}
        assert tiers == {"critical": ["hrpool_critical", "0", "0"], "high": ["hrpool_high", "0", "0"],
                         "normal": ["hrpool_normal", str(FILLERS), "1"],
                         "critical_ckpt": ["hrpool_critical_ckpt", "0", "0"],
                         "high_ckpt": ["hrpool_high_ckpt", "0", "0"],
                         "normal_ckpt": ["hrpool_normal_ckpt", "0", "0"]}, status.stdout
    finally:
        pool.run("scancel", waiting, check=False)


def test_a_critical_job_preempts_and_requeues_a_normal_one(pool: BigPool, a100_full: list[str]) -> None:
    assert _running(pool, a100_full)
    critical = job_id(sbatch(pool, "-A", BIG, "--qos=critical", "-p", "gpu-a100", "-N1", *WHOLE_NODE,
                             "--gres=gpu:a100:2", "-t", "5", "-J", "critical", "--wrap", "sleep 300"))
    seen: dict[str, dict[str, Any]] = {}

    def preempted() -> bool:
        # The preempted job passes through COMPLETING/REQUEUED before it pends again.
        seen.update(jobs(pool))
        back = [i for i in a100_full if seen[i]["restart_cnt"] >= 1 and seen[i]["job_state"] == "PENDING"]
        return seen[critical]["job_state"] == "RUNNING" and bool(back)

    try:
        assert wait_for(preempted, 120), {i: (seen[i]["job_state"], seen[i]["restart_cnt"], seen[i]["state_reason"])
                                          for i in [critical, *a100_full] if i in seen}
        assert seen[critical]["qos"] == "hrpool_critical" and seen[critical]["nodes"] in A100_NODES
        requeued = [i for i in a100_full if seen[i]["restart_cnt"] >= 1]
        assert [seen[i]["restart_cnt"] for i in requeued] == [1] * len(requeued)
        assert len(requeued) < FILLERS, "a 1-node job needs one 6-node job's nodes, not all of them"
    finally:
        pool.run("scancel", critical, *a100_full, check=False)


@pytest.mark.usefixtures("applied")
def test_a_critical_job_preempts_the_checkpointing_job_before_plain_ones(pool: BigPool, policy_file: Path) -> None:
    """Preemption by work lost, by Slurm's own mechanisms plus hetrun's placement: the a100
    nodes held by four plain normal jobs, the v100 nodes by three plain ones and one (as large)
    asking for normal_ckpt. hetrun's placement of a 1-node critical job that accepts either
    type (``placement.score`` with the tier's ``preemption_sets``) ranks gpu-v100 first, where
    a preemption loses least although the name order says a100, and names one of the
    checkpointing job's nodes (``ranked_list``'s ``nodelist``, gpu-v100 alone); Slurm starts the
    job there and preempts the checkpointing job; every plain job runs on."""
    from hetrun.slurm_plugin import placement
    from hetrun.slurm_plugin import pool as pool_mod
    from hetrun.slurm_plugin.placement_fit import ranked_list
    from hetrun.slurm_plugin.policy.desired import preemption_sets
    from hetrun.slurm_plugin.policy.model import load_policy

    def filler(qos: str, gtype: str) -> str:
        return job_id(sbatch(pool, "-A", BIG, f"--qos={qos}", "-p", f"gpu-{gtype}", f"-N{FILLER_NODES}", *WHOLE_NODE,
                             f"--gres=gpu:{gtype}:2", "-t", "10", "--requeue", "-J", f"fill-{qos}", "--wrap",
                             "sleep 600"))

    ckpt = filler("normal_ckpt", "v100")  # submitted first: the oldest, so age would not pick it
    plain = [filler("normal", "v100") for _ in range(FILLERS - 1)] + [filler("normal", "a100") for _ in range(FILLERS)]
    critical = None
    seen: dict[str, dict[str, Any]] = {}
    try:
        assert wait_for(lambda: _running(pool, [ckpt, *plain]), 120), {
            i: jobs(pool).get(i, {}).get("state_reason") for i in [ckpt, *plain]}
        assert jobs(pool)[ckpt]["qos"] == "hrpool_normal_ckpt"
        preempts, clean = preemption_sets(load_policy(policy_file), "critical")
        need = placement.Need(1, 4, 2, 320, gpu_types=("a100", "v100"), partitions=("gpu-a100", "gpu-v100"),
                              preempts=preempts, stops_clean=clean)
        cands = placement.score(need, pool_mod.collect(lambda argv: pool.run(*argv).stdout, hours=0.05))
        ranked = ranked_list(cands, gpus=True)
        ckpt_nodes = set(pool.run("scontrol", "show", "hostnames", jobs(pool)[ckpt]["nodes"]).stdout.split())
        assert ranked.partitions == ["gpu-v100"], [(c.label, c.score, c.reasons) for c in cands]
        assert len(ranked.nodelist) == 1 and set(ranked.nodelist) <= ckpt_nodes, (ranked, ckpt_nodes)
        critical = job_id(sbatch(pool, "-A", BIG, "--qos=critical", "-p", ",".join(ranked.partitions), "-N1",
                                 f"--nodelist={','.join(ranked.nodelist)}", *WHOLE_NODE, "--gres=gpu:2", "-t", "5",
                                 "-J", "critical", "--wrap", "sleep 300"))

        def started() -> bool:
            seen.update(jobs(pool))
            return seen[critical]["job_state"] == "RUNNING"

        assert wait_for(started, 120), {i: (seen.get(i, {}).get("job_state"), seen.get(i, {}).get("restart_cnt"))
                                        for i in [critical, ckpt, *plain]}
        assert seen[critical]["nodes"] == ranked.nodelist[0], seen[critical]["nodes"]
        assert seen[ckpt]["restart_cnt"] == 1, "the checkpointing job is the one preempted"
        assert [seen[i]["restart_cnt"] for i in plain] == [0] * len(plain)
        assert all(seen[i]["job_state"] == "RUNNING" for i in plain)
    finally:
        pool.run("scancel", *[i for i in (critical, ckpt, *plain) if i], check=False)


@pytest.mark.usefixtures("applied")
def test_with_spare_plain_a_critical_job_waits_for_plain_jobs_instead_of_preempting(
        pool: BigPool, policy_file: Path, tmp_path: Path) -> None:
    """``checkpointed: {spare_plain: true}`` applied by `hetrun policy apply`: the tiers' QOS
    preempt only the lower tiers' _ckpt QOS (sacctmgr's read-back), and with the a100 nodes held
    by plain normal jobs a critical job for gpu-a100 pends through several scheduler passes
    (sched_interval 2 s here) while every plain job runs on; a checkpointing job there is
    preempted for it at once. The policy as it was is applied again after."""
    spare = tmp_path / "spare.yaml"
    spare.write_text(POLICY.replace("checkpointed: {}", "checkpointed: {spare_plain: true}"))
    proc = cli(pool, "policy", "apply", str(spare))
    ids: list[str] = []
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        preempt = {name: set(filter(None, lst.split(","))) for name, lst in (line.split("|", 1) for line in pool.run(
            "sacctmgr", "-n", "-P", "show", "qos", "format=Name,Preempt").stdout.split() if "|" in line)}
        assert preempt["hrpool_critical"] == preempt["hrpool_critical_ckpt"] == {"hrpool_high_ckpt", "hrpool_normal_ckpt"}
        assert preempt["hrpool_high"] == {"hrpool_normal_ckpt"}
        ids = [job_id(sbatch(pool, "-A", BIG, "--qos=normal", "-p", "gpu-a100", f"-N{FILLER_NODES}", *WHOLE_NODE,
                             "--gres=gpu:a100:2", "-t", "10", "--requeue", "-J", "fill-plain", "--wrap", "sleep 600"))
               for _ in range(FILLERS)]
        assert wait_for(lambda: _running(pool, ids), 120), {i: jobs(pool).get(i, {}).get("state_reason") for i in ids}
        critical = job_id(sbatch(pool, "-A", BIG, "--qos=critical", "-p", "gpu-a100", "-N1", *WHOLE_NODE,
                                 "--gres=gpu:a100:2", "-t", "5", "-J", "critical", "--wrap", "sleep 300"))
        ids.append(critical)
        assert not wait_for(lambda: jobs(pool)[critical]["job_state"] != "PENDING", 8), jobs(pool)[critical]
        seen = jobs(pool)
        assert [(seen[i]["job_state"], seen[i]["restart_cnt"]) for i in ids[:-1]] == [("RUNNING", 0)] * FILLERS
        # One plain job's nodes go to a checkpointing job: a critical job preempts that one.
        pool.run("scancel", critical, ids[0])
        ckpt = job_id(sbatch(pool, "-A", BIG, "--qos=normal_ckpt", "-p", "gpu-a100", f"-N{FILLER_NODES}",
                             *WHOLE_NODE, "--gres=gpu:a100:2", "-t", "10", "--requeue", "-J", "fill-ckpt",
                             "--wrap", "sleep 600"))
        ids.append(ckpt)
        assert wait_for(lambda: _running(pool, [ckpt]), 120), jobs(pool)[ckpt]
        again = job_id(sbatch(pool, "-A", BIG, "--qos=critical", "-p", "gpu-a100", "-N1", *WHOLE_NODE,
                              "--gres=gpu:a100:2", "-t", "5", "-J", "critical", "--wrap", "sleep 300"))
        ids.append(again)
        assert wait_for(lambda: jobs(pool)[again]["job_state"] == "RUNNING", 120), jobs(pool)[again]
        seen = jobs(pool)
        assert seen[ckpt]["restart_cnt"] == 1, "the checkpointing job is the one preempted"
        assert [(seen[i]["job_state"], seen[i]["restart_cnt"]) for i in ids[1:FILLERS]] == [("RUNNING", 0)] * 3
    finally:
        pool.run("scancel", *ids, check=False)
        back = cli(pool, "policy", "apply", str(policy_file))
        assert back.returncode == 0, back.stdout + back.stderr


def test_numa_aware_isolation_is_refused_where_the_pool_claims_more_cpus_than_the_host(
        policy_file: Path, tmp_path: Path) -> None:
    """Nothing starts: the pool's config is rendered with the policy's isolation and refused."""
    cpus = os.cpu_count() or 0
    if cpus >= 4 and detect_cgroup().usable:
        pytest.skip(f"this host ({cpus} CPUs, cgroups usable) could run numa-aware on the pool; "
                    "it is not started with it here (tests/test_policy_isolation_live.py runs isolation)")
    numa = tmp_path / "numa.yaml"
    numa.write_text(POLICY.replace('isolation: "none"', 'isolation: "numa-aware"'))
    from hetrun.slurm_plugin.cluster_setup import slurm_conf_with_policy

    with pytest.raises(SlurmError, match=r"cpu\.isolation: numa-aware"):
        slurm_conf_with_policy(BigPool(policy=numa).cfg)

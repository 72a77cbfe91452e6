"""The rendered job_submit.lua, run by a real Lua 5.1 (the Lua Debian's Slurm 22.05
job_submit_lua.so links against).

slurmctld itself cannot load it here: that needs JobSubmitPlugins=lua in the
shared test cluster's slurm.conf, which tests must not change. So the script
runs under ``lua5.1`` with FAKE_SLURM below standing in for the ``slurm``
table slurmctld provides (SUCCESS/ERROR, log_user, log_info), on job_desc
tables shaped like Slurm 22.05's. UNSET below is what slurmctld 22.05.8 really
hands the script for `sbatch --wrap ...` with no options (read from a live
slurmctld with a dumping job_submit.lua): 16-bit counts unset are NO_VAL16
(65534), 32-bit ones NO_VAL, min_cpus is 1, memory fields nil; partitions show
def_mem_per_cpu (nil unless set) and def_mem_per_node (0 unless set). The same
shapes against real slurmctld, as non-root users: tests/test_policy_cluster2.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import in_ci
from hetrun.slurm_plugin.policy.lua import class_to_tier, render_job_submit_lua
from hetrun.slurm_plugin.policy.model import load_policy

NO_VAL = 4294967294
NO_VAL16 = 65534
INFINITE16 = 65535
UNSET = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "cpus_per_task": NO_VAL16,
         "min_cpus": 1, "pn_min_cpus": NO_VAL16, "ntasks_per_node": NO_VAL16, "time_limit": NO_VAL,
         "het_job_offset": NO_VAL, "pn_min_memory": 2.0**64 - 2}
POLICY = """\
resources:
  gpu:
    type: [a100]
    count: 8
    scheduling: {priority: [critical, high, normal], preemption: true}
naming: {qos_prefix: pool_}
accounts:
  vision:
    quota: {gpu: 4, cpu: 6, mem: 8Gi}
    users: [alice]
  lab:
    quota: {cpu: 4, mem: 2000M, node: 2}
time_slicing: {partition: short, max_wall: "00:10:00"}
"""

FAKE_SLURM = """\
slurm = {SUCCESS = 0, ERROR = -1}
function slurm.log_user(fmt, ...) io.write("USER: ", string.format(fmt, ...), "\\n") end
function slurm.log_info(fmt, ...) end
"""


def _lua() -> str:
    exe = shutil.which("lua5.1")
    if exe is None:
        if in_ci():
            pytest.fail("lua5.1 is missing (scripts/setup.sh installs it); not skipping in CI", pytrace=False)
        pytest.skip("lua5.1 is not installed (apt-get install lua5.1)")
    return exe


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "policy.yaml").write_text(POLICY)
    out = tmp_path / "job_submit.lua"
    out.write_text(render_job_submit_lua(load_policy(tmp_path / "policy.yaml")))
    # The slurm.conf next to the script, as slurmctld has it: the global memory default.
    (tmp_path / "slurm.conf").write_text("ClusterName=x\nDefMemPerCPU=300 # MB\n"
                                         "NodeName=n1 CPUs=2 DefMemPerCPU=9999\n"
                                         "PartitionName=debug Nodes=n1 Default=YES\n"
                                         "PartitionName=big Nodes=n1 DefMemPerCPU=900\n"
                                         "PartitionName=gpu Nodes=n1 DefCpuPerGPU=2 DefMemPerGPU=1500\n")
    return out


def _lua_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_lua_value(x)}" for k, x in v.items()) + "}"
    return f'"{v}"'


# part_list as slurmctld 22.05 passes it: partitions by name, memory defaults as observed.
PARTS = {"debug": {"name": "debug", "def_mem_per_node": 0}, "big": {"name": "big", "def_mem_per_cpu": 900},
         "fat": {"name": "fat", "def_mem_per_node": 1500}, "gpu": {"name": "gpu", "def_mem_per_node": 0}}


def submit_many(script: Path, jobs: list[dict[str, object]]) -> list[tuple[int, str | None, str | None, str]]:
    """Run slurm_job_submit on each job_desc in one lua process (in order: het
    components follow each other); (rc, qos, partition, user message) each."""
    calls = []
    for job in jobs:
        fields = {**UNSET, "default_account": "vision", **job}
        calls.append(f"run({{{', '.join(f'{k} = {_lua_value(v)}' for k, v in fields.items())}}})")
    parts = "{" + ", ".join(f'["{n}"] = {_lua_value(p)}' for n, p in PARTS.items()) + "}"
    driver = (FAKE_SLURM + f'dofile("{script}")\n'
              "local function run(jd)\n"
              f"  local rc = slurm_job_submit(jd, {parts}, 1000)\n"
              '  print("RESULT", rc, jd.qos or "nil", jd.partition or "nil")\n'
              "end\n" + "\n".join(calls) + "\n")
    proc = subprocess.run([_lua(), "-"], input=driver, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out: list[tuple[int, str | None, str | None, str]] = []
    user = ""
    nil = lambda s: None if s == "nil" else s  # noqa: E731
    for ln in proc.stdout.splitlines():
        if ln.startswith("USER: "):
            user += ln[6:]
        elif ln.startswith("RESULT"):
            r = ln.split("\t")
            out.append((int(r[1]), nil(r[2]), nil(r[3]), user))
            user = ""
    assert len(out) == len(jobs), proc.stdout
    return out


def submit(script: Path, **job: object) -> tuple[int, str | None, str | None, str]:
    """Run slurm_job_submit on one job_desc; (rc, qos, partition, user message)."""
    return submit_many(script, [job])[0]


def test_luac_accepts_the_rendered_script(script: Path) -> None:
    _lua()
    proc = subprocess.run(["luac5.1", "-p", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_a_job_without_a_tier_gets_the_default_qos(script: Path) -> None:
    assert submit(script, min_nodes=1)[:3] == (0, "pool_normal", None)
    # Accounts outside the policy keep Slurm's own default QOS.
    assert submit(script, account="other")[:2] == (0, None)


@pytest.mark.parametrize(("asked", "qos"), [("critical", "pool_critical"), ("high", "pool_high"),
                                            ("low", "pool_normal"), ("pool_high", "pool_high"),
                                            ("site_special", "site_special")])
def test_tiers_and_hetrun_classes_map_onto_the_tier_qos(script: Path, asked: str, qos: str) -> None:
    assert submit(script, qos=asked)[:2] == (0, qos)


def test_a_job_over_its_accounts_quota_is_refused_naming_the_quota(script: Path) -> None:
    # slurmctld 22.05 shows the request both as tres_per_node and as the older gres field.
    rc, _, _, msg = submit(script, account="vision", min_nodes=2, tres_per_node="gres:gpu:a100:3",
                           gres="gres:gpu:a100:3")
    assert rc == -1
    assert "gres/gpu=6" in msg and "account vision's quota is GrpTRES gres/gpu=4" in msg
    rc, _, _, msg = submit(script, num_tasks=8, cpus_per_task=1)  # default account vision
    assert rc == -1 and "cpu=8" in msg and "GrpTRES cpu=6" in msg
    assert submit(script, account="other", num_tasks=64)[0] == 0
    assert submit(script, account="vision", min_nodes=2, tres_per_node="gres:gpu:2")[0] == 0


def test_short_jobs_without_a_partition_go_to_the_time_sliced_one(script: Path) -> None:
    assert submit(script, time_limit=5)[2] == "short"
    assert submit(script, time_limit=60)[2] is None
    assert submit(script, time_limit=5, partition="debug")[2] == "debug"
    assert submit(script)[2] is None
    # A short GPU job stays where Slurm routes it: the sliced partition may have no GPU node.
    assert submit(script, time_limit=5, tres_per_node="gres:gpu:1", gres="gres:gpu:1")[2] is None
    assert submit(script, time_limit=5, tres_per_node="gres:shard:1")[2] is None


def test_names_are_escaped_in_the_lua_table(tmp_path: Path) -> None:
    # A name the policy would reject still cannot break out of its Lua string.
    from hetrun.slurm_plugin.policy.lua import _lua_str

    assert _lua_str('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


def test_class_mapping_with_two_tiers(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("resources:\n  gpu:\n    count: 1\n    scheduling: {priority: [urgent, batch]}\n")
    assert class_to_tier(load_policy(p)) == {"low": "batch", "normal": "batch", "high": "urgent",
                                            "critical": "urgent"}


def _shape(**opts: object) -> dict[str, object]:
    """A job_desc as slurmctld 22.05 fills it for the sbatch options given
    (min_cpus as the client computes it: tasks x cpus-per-task, or one per node)."""
    jd: dict[str, object] = {"account": "lab"}
    n, N, c = opts.pop("n", None), opts.pop("N", None), opts.pop("c", None)
    tpn = opts.pop("ntasks_per_node", None)
    if N is not None:
        jd["min_nodes"] = jd["max_nodes"] = N
    if tpn is not None:
        jd["ntasks_per_node"] = tpn
        n = tpn * (N or 1)
    if n is not None:
        jd["num_tasks"] = n
    if c is not None:
        jd["cpus_per_task"] = jd["pn_min_cpus"] = c
    jd["min_cpus"] = (n or 1) * (c or 1) if n is not None else max(N or 1, c or 1)
    return {**jd, **opts}


# (what the user typed, job_desc, refused?, what the refusal names). Quotas: account lab
# cpu=4 mem=2000M node=2; vision gres/gpu=4; slurm.conf DefMemPerCPU=300, partition big
# DefMemPerCPU=900, partition fat DefMemPerNode=1500, partition gpu DefCpuPerGPU=2 DefMemPerGPU=1500
# (on its slurm.conf line: 22.05's part_list does not show them).
SHAPES = [
    ("no options", _shape(), False, ""),
    ("-n 1 (cpus-per-task unset: NO_VAL16)", _shape(n=1), False, ""),
    ("-n 1, cpus-per-task INFINITE16", _shape(n=1, cpus_per_task=INFINITE16), False, ""),
    ("-n 4", _shape(n=4), False, ""),
    ("-n 5", _shape(n=5), True, "cpu=5 "),
    ("-c 4", _shape(c=4), False, ""),
    ("-c 5", _shape(c=5), True, "cpu=5 "),
    ("-n 2 -c 2", _shape(n=2, c=2), False, ""),
    ("-n 3 -c 2", _shape(n=3, c=2), True, "cpu=6 "),
    ("-N 2", _shape(N=2), False, ""),
    ("-N 3", _shape(N=3), True, "node=3 "),
    ("-N 2 -c 2 (one task per node)", _shape(N=2, c=2), False, ""),
    ("-N 2 -c 3", _shape(N=2, c=3), True, "cpu=6 "),
    ("-N 2 --ntasks-per-node=2", _shape(N=2, ntasks_per_node=2), False, ""),
    ("-N 2 --ntasks-per-node=3", _shape(N=2, ntasks_per_node=3), True, "cpu=6 "),
    ("--mincpus=2 -N 2", _shape(N=2, pn_min_cpus=2, min_cpus=2), False, ""),
    ("--mincpus=3 -N 2", _shape(N=2, pn_min_cpus=3, min_cpus=3), True, "cpu=6 "),
    ("--mem=2000", _shape(min_mem_per_node=2000, pn_min_memory=2000), False, ""),
    ("--mem=2001", _shape(min_mem_per_node=2001), True, "mem=2001M "),
    ("-N 2 --mem=1001 (per node)", _shape(N=2, min_mem_per_node=1001), True, "mem=2002M "),
    ("--mem=0 (whole node: left to Slurm)", _shape(min_mem_per_node=0), False, ""),
    ("-n 4 --mem-per-cpu=500", _shape(n=4, min_mem_per_cpu=500), False, ""),
    ("-n 4 --mem-per-cpu=501", _shape(n=4, min_mem_per_cpu=501), True, "mem=2004M "),
    ("-n 4, slurm.conf DefMemPerCPU=300", _shape(n=4), False, ""),
    ("-p big -n 2, partition DefMemPerCPU=900", _shape(n=2, partition="big"), False, ""),
    ("-p big -n 3", _shape(n=3, partition="big"), True, "mem=2700M "),
    ("-p fat -N 2, partition DefMemPerNode=1500", _shape(N=2, partition="fat"), True, "mem=3000M "),
    ("-p fat,debug -N 2: the smaller default", _shape(N=2, partition="fat,debug"), False, ""),
    ("-p gpu --gpus=1: DefCpuPerGPU 2, DefMemPerGPU 1500", {**_shape(), "partition": "gpu",
                                                           "tres_per_job": "gres:gpu:1"}, False, ""),
    ("-p gpu --gpus=2: 3000M by DefMemPerGPU", {**_shape(), "partition": "gpu", "tres_per_job": "gres:gpu:2"},
     True, "mem=3000M "),
    ("-p gpu --gpus=3 --mem=100: 6 CPUs by DefCpuPerGPU", {**_shape(min_mem_per_node=100), "partition": "gpu",
                                                          "tres_per_job": "gres:gpu:3"}, True, "cpu=6 "),
    ("-p gpu --gpus=3 -c 1 --mem=100: -c wins over DefCpuPerGPU", {**_shape(c=1, min_mem_per_node=100),
                                                                   "partition": "gpu", "tres_per_job": "gres:gpu:3"},
     False, ""),
    ("--array=0-7 -n 1: each task is one job", _shape(n=1, array_inx="0-7"), False, ""),
    ("--array=0-7 -n 5", _shape(n=5, array_inx="0-7"), True, "cpu=5 "),
    ("-A vision -N 2 --gres=gpu:a100:2", {**_shape(N=2), "account": "vision",
                                         "tres_per_node": "gres:gpu:a100:2", "gres": "gres:gpu:a100:2"}, False, ""),
    ("-A vision --gpus=5", {**_shape(), "account": "vision", "tres_per_job": "gres:gpu:5"}, True, "gres/gpu=5 "),
    ("-A vision -n 5 --gpus-per-task=1", {**_shape(n=5), "account": "vision", "tres_per_task": "gres:gpu:1"},
     True, "gres/gpu=5 "),
    ("-A other -n 64 (no quota)", {**_shape(n=64), "account": "other"}, False, ""),
]


def test_every_request_shape_against_the_quota(script: Path) -> None:
    results = submit_many(script, [jd for _, jd, _, _ in SHAPES])
    wrong = []
    for (typed, _, refused, names), (rc, _, _, msg) in zip(SHAPES, results, strict=True):
        if (rc != 0) != refused or (refused and names not in msg + " "):
            wrong.append(f"  {typed}: expected {'refused naming ' + names.strip() if refused else 'accepted'}, "
                         f"got rc={rc} {msg!r}")
    assert not wrong, "the lua misreads these requests:\n" + "\n".join(wrong)


def test_het_components_count_together(script: Path) -> None:
    # sbatch -A lab -n 2 : -n 2 (fits cpu=4) then -n 2 : -n 3 (cpu=5 together), then a plain job.
    het = [_shape(n=2, het_job_offset=0), _shape(n=2, het_job_offset=1),
           _shape(n=2, het_job_offset=0), _shape(n=3, het_job_offset=1), _shape(n=4)]
    rcs = submit_many(script, het)
    assert [r[0] for r in rcs] == [0, 0, 0, -1, 0], rcs
    assert "components together ask for cpu=5" in rcs[3][3]

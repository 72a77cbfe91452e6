"""The rendered job_submit.lua, run by a real Lua 5.1 (the Lua Debian's Slurm 22.05
job_submit_lua.so links against).

slurmctld itself cannot load it here: that needs JobSubmitPlugins=lua in the
shared test cluster's slurm.conf, which tests must not change. So the script
runs under ``lua5.1`` with FAKE_SLURM below standing in for the ``slurm``
table slurmctld provides (SUCCESS/ERROR, log_user, log_info), on job_desc
tables shaped like Slurm 22.05's (unset numbers are NO_VAL = 0xfffffffe).
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
    return out


def submit(script: Path, **job: object) -> tuple[int, str | None, str | None, str]:
    """Run slurm_job_submit on one job_desc; (rc, qos, partition, user message)."""
    fields = {"min_nodes": NO_VAL, "num_tasks": NO_VAL, "cpus_per_task": NO_VAL, "min_cpus": NO_VAL,
              "time_limit": NO_VAL, "default_account": "vision", **job}
    body = ", ".join(f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in fields.items())
    driver = (FAKE_SLURM + f'dofile("{script}")\n'
              f"local jd = {{{body}}}\n"
              "local rc = slurm_job_submit(jd, {}, 0)\n"
              'print("RESULT", rc, jd.qos or "nil", jd.partition or "nil")\n')
    proc = subprocess.run([_lua(), "-"], input=driver, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    result = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")).split("\t")
    user = "".join(ln[6:] for ln in proc.stdout.splitlines() if ln.startswith("USER: "))
    nil = lambda s: None if s == "nil" else s  # noqa: E731
    return int(result[1]), nil(result[2]), nil(result[3]), user


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

"""Policy files: the issue's shape is valid as written; every kind of mistake is a
SpecError naming file:line:col, the key path, the bad value and the fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hetrun.slurm_plugin.policy.model import load_policy, size_mb

from hetrun.errors import SpecError

ISSUE_SHAPE = """\
resources:
  gpu:
    type: ["V100", "A100"]
    count: 64
    scheduling:
      priority: ["critical", "high", "normal"]
      preemption: true
  cpu:
    cores: 256
    memory: 1024Gi
    isolation: "numa-aware"
"""

FULL = ISSUE_SHAPE + """\
tiers:
  critical: {max_wall: "1-00:00:00", max_tres_per_user: {gpu: 8}}
accounts:
  vision:
    fairshare: 40
    quota: {gpu: 16, cpu: 64, mem: 256Gi, "gpu:a100": 8}
    max_per_user: {gpu: 8}
    tiers: [high, normal]
    users: [alice, bob]
time_slicing: {partition: debug, max_wall: "00:10:00", jobs_per_core: 2}
power: {idle_after: "30:00", suspend_program: /usr/local/sbin/node-off, resume_program: /usr/local/sbin/node-on}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def error_of(tmp_path: Path, text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_policy(write(tmp_path, text))
    return info.value


def test_the_issue_shape_is_valid_as_written(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, ISSUE_SHAPE))
    assert p.tier_names == ["critical", "high", "normal"]
    assert p.default_tier == "normal" and p.preemption
    assert p.resources.cpu is not None and size_mb(p.resources.cpu.memory) == 1024 * 1024
    assert p.resources.gpu is not None and p.resources.gpu.type == ["V100", "A100"]


def test_the_extended_shape_is_valid(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, FULL))
    vision = p.accounts["vision"]
    assert vision.quota is not None
    assert vision.quota.as_slurm() == {"gres/gpu": 16, "cpu": 64, "mem": 256 * 1024, "gres/gpu:a100": 8}
    assert p.time_slicing is not None and p.time_slicing.partition == "debug"


@pytest.mark.parametrize(
    ("text", "where", "needle", "hint"),
    [
        (ISSUE_SHAPE.replace("preemption: true", "preemtion: true"), ":7:18:", "unknown key 'preemtion'",
         "did you mean 'preemption'?"),
        (ISSUE_SHAPE.replace('"numa-aware"', '"numa"'), ":11:16:", "'numa' is not one of", None),
        (ISSUE_SHAPE.replace("count: 64", 'count: "64"'), ":4:12:", "expected an integer", "without quotes"),
        (ISSUE_SHAPE.replace("1024Gi", "lots"), ":10:13:", "'lots' is not a memory size", None),
        (ISSUE_SHAPE.replace('"high", "normal"', '"high", "high"'), ":6:17:", "tiers listed twice: high",
         None),
        (ISSUE_SHAPE.replace('"critical"', '"Crit ical"'), ":6:17:", "not a valid lower-case Slurm name", None),
        (FULL.replace("quota: {gpu: 16,", "quota: {gpus: 16,"), ":17:19:", "TRES key 'gpus'",
         "did you mean 'gpu'?"),
        (FULL.replace("tiers: [high, normal]", "tiers: [high, norma]"), ":19:19:", "tier 'norma' is not in",
         "did you mean 'normal'?"),
        (FULL.replace('"gpu:a100": 8', '"gpu:h100": 8'), ":17:55:", "GPU type 'h100' is not in", None),
        (FULL.replace("/usr/local/sbin/node-off", "node-off"), ":22:47:", "must be an absolute path", None),
        (FULL.replace('max_wall: "00:10:00"', 'max_wall: "ten"'), ":21:44:", "is not a Slurm time", None),
        (FULL.replace("  critical: {", "  urgent: {"), ":13:11:", "tier 'urgent' is not in", None),
    ],
)
def test_bad_policies_name_file_line_col_key_and_fix(tmp_path: Path, text: str, where: str, needle: str,
                                                     hint: str | None) -> None:
    err = error_of(tmp_path, text)
    msg = str(err)
    assert f"policy.yaml{where}" in msg, msg
    assert needle in msg, msg
    if hint:
        assert err.hint is not None and hint in err.hint, msg
    assert err.exit_code == 2


def test_not_a_mapping_and_missing_resources(tmp_path: Path) -> None:
    assert "expected a mapping with resources" in str(error_of(tmp_path, "- a\n- b\n"))
    err = error_of(tmp_path, "accounts: {}\n")
    assert "missing required key 'resources'" in str(err)


def test_cli_check_prints_ok_and_errors_without_traceback(tmp_path: Path) -> None:
    good = write(tmp_path, FULL)
    ok = subprocess.run([sys.executable, "-m", "hetrun.cli", "policy", "check", str(good)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "tiers critical, high, normal" in ok.stdout and "1 accounts, 2 users" in ok.stdout
    bad = write(tmp_path, FULL.replace("fairshare: 40", "fairshare: -1"))
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "policy", "check", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "policy.yaml:16:16: accounts.vision.fairshare" in out.stderr
    assert "Traceback" not in out.stderr


BACKFILL = ISSUE_SHAPE.replace("preemption: true", "preemption: true\n      backfill: {min_reserve_tier: high, busy_nodes: true}")


def test_backfill_block_is_valid_and_checks_its_tier(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, BACKFILL))
    backfill = p.resources.gpu.scheduling.backfill
    assert backfill is not None and backfill.min_reserve_tier == "high" and backfill.busy_nodes
    err = error_of(tmp_path, BACKFILL.replace("min_reserve_tier: high", "min_reserve_tier: hihg"))
    assert "policy.yaml:8:36:" in str(err) and "tier 'hihg' is not in" in str(err)
    assert err.hint is not None and "did you mean 'high'?" in err.hint
    err = error_of(tmp_path, BACKFILL.replace("busy_nodes", "busy_node"))
    assert "policy.yaml:8:" in str(err) and "unknown key 'busy_node'" in str(err)

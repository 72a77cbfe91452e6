"""The pool trace replay's time-scale corrections (benchmarks/pool_trace_replay.py): the
scheduler cadence both pools get and every job's --time limit. Rendering only, no pool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import pool_trace_replay as replay


def _sched(conf: str) -> list[str]:
    return [ln for ln in conf.splitlines() if "SchedulerParameters" in ln]


@pytest.mark.parametrize(("cadence", "line"), [
    ("compressed", "SchedulerParameters=bf_interval=1,sched_interval=1,bf_resolution=1,bf_continue"),
    ("rendered", "SchedulerParameters=bf_interval=2,sched_interval=2"),
    ("slurm-default", "# SchedulerParameters: Slurm's defaults"),
])
def test_both_pools_get_the_cadence(tmp_path: Path, cadence: str, line: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(replay.POLICY)
    for pool in (replay.ReplayPool(cadence=cadence), replay.ReplayPool(policy=policy, cadence=cadence)):
        assert _sched(pool.render_conf()) == [line]


def test_a_policy_backfill_block_survives_the_cadence(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(replay.with_backfill(replay.POLICY, "{min_reserve_tier: high, busy_nodes: true}"))
    conf = replay.ReplayPool(policy=policy, cadence="compressed").render_conf()
    assert _sched(conf) == ["SchedulerParameters=bf_min_prio_reserve=4434,bf_busy_nodes,"
                            "bf_interval=1,sched_interval=1,bf_resolution=1,bf_continue"]
    conf = replay.ReplayPool(policy=policy, cadence="slurm-default").render_conf()
    assert _sched(conf) == ["SchedulerParameters=bf_min_prio_reserve=4434,bf_busy_nodes"]


def test_time_limits_tight_and_fixed() -> None:
    job = replay.make_trace(14, 300, 150)[0]
    limits = {s: replay.time_limit_min(replay.TraceJob(**{**job.__dict__, "seconds": s}), "tight")
              for s in (5, 45, 46, 60)}
    assert limits == {5: 1, 45: 1, 46: 2, 60: 2}
    assert replay.time_limit_min(job, "5min") == 5
    assert f"--time={replay.time_limit_min(job, 'tight')}" in replay.sbatch_argv(job, "n", "cpu", None, False)


def test_spare_plain_side_and_the_by_hand_backfill() -> None:
    """``--spare-plain``: the policy side's placement sets come from the policy the pool runs
    (plain QOS never a victim); ``--hand-backfill``: the by-hand policy keeps the backfill block
    and still has no checkpointing QOS."""
    spare = replay.with_spare_plain(replay.POLICY, True)
    assert replay.with_spare_plain(replay.POLICY, False) == replay.POLICY
    sets = replay.tier_preemption(True, spare)
    assert sets["critical"] == (("hrpool_high_ckpt", "hrpool_normal_ckpt"),) * 2
    assert "hrpool_normal" in replay.tier_preemption(True)["critical"][0]
    hand = replay.hand_policy(replay.with_backfill(replay.POLICY, "{busy_nodes: true}"))
    assert "backfill: {busy_nodes: true}" in hand and "checkpointed" not in hand

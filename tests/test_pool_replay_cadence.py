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


def test_young_plain_experiment_qos_and_placement(monkeypatch) -> None:
    """``--young-plain`` (benchmarks/replay_young_plain.py): each tier above the lowest gets a
    ``_young`` QOS at its priority that may preempt every lower QOS; where a critical job cannot
    start on checkpointing victims, ``fit`` asks for it only when every plain victim is young."""
    import replay_young_plain as young
    from hetrun.slurm_plugin import pool
    from test_placement import TYPES, snapshot

    spare = replay.with_spare_plain(replay.POLICY, True)
    qos = young.young_qos(spare)
    assert list(qos) == ["high", "critical"]  # the lowest first: a Preempt list names existing QOS
    assert qos["high"] == ("hrpool_high_young", 2000, ("hrpool_normal", "hrpool_normal_ckpt"))
    assert qos["critical"][2] == ("hrpool_high", "hrpool_high_ckpt", "hrpool_high_young", "hrpool_normal",
                                  "hrpool_normal_ckpt")
    argvs = young.sacctmgr_argvs(spare, replay.ACCOUNT)
    assert argvs[0][:5] == ["sacctmgr", "-i", "add", "qos", "hrpool_high_young"]
    assert argvs[-1][-1] == "qos+=hrpool_high_young,hrpool_critical_young"
    sets = young.young_sets(spare)
    assert sets["critical"][2] == ("hrpool_high_ckpt", "hrpool_normal_ckpt")
    assert list(young.young_sets(spare, ("critical",))) == ["critical"]  # --young-tiers critical

    def busy(ran: float) -> pool.PoolSnapshot:  # every GPU node runs one plain normal job
        snap = snapshot(TYPES, busy=set(TYPES))
        snap.taken_at = 1000.0
        snap.running_use = [pool.RunningUse(replay.ACCOUNT, "root", "hrpool_normal", {"node": 1}, i + 1, (n.name,),
                                            1000.0 - ran) for i, n in enumerate(snap.nodes) if n.gres != pool.NO_GRES]
        return snap

    class Snaps:
        def __init__(self, snap: pool.PoolSnapshot) -> None:
            self.snap = snap

        def snapshot(self) -> pool.PoolSnapshot:
            return self.snap

    job = replay.TraceJob(0, 0.0, "critical", 1, 10, ("a100", "v100"), "gpu-a100")
    spare_sets = replay.tier_preemption(True, spare)
    monkeypatch.setattr(replay, "PARTITIONS", ())  # the sample pool's partitions ...
    monkeypatch.setattr(replay, "CPUS", 1)  # ... and 2-CPU nodes
    *_, nodelist, asked = replay.fit(job, Snaps(busy(5.0)), True, spare_sets, sets, 10.0)
    assert asked == "hrpool_critical_young" and len(nodelist) == 1
    *_, nodelist, asked = replay.fit(job, Snaps(busy(50.0)), True, spare_sets, sets, 10.0)
    assert asked is None and nodelist == ()  # every plain job is older: it waits in its own QOS
    argv = replay.sbatch_argv(job, "n", "gpu-a100", "a100", True, nodelist=("n1",), qos_name="hrpool_critical_young")
    assert "--qos=hrpool_critical_young" in argv and "--nodelist=n1" in argv

"""The pool trace replay's issue-21 parts (benchmarks/pool_trace_replay.py), without a pool:
the "Slurm by hand" submission, the checkpointing trace jobs' sbatch lines, and the work a cut
run lost (sleeps: all of it; a job with a run directory: since its newest save)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import pool_trace_replay as replay
from hetrun.slurm_plugin.policy.desired import desired_state
from hetrun.slurm_plugin.policy.model import validate_policy_data


def _job(**kw: object) -> replay.TraceJob:
    base = {"i": 0, "at": 0.0, "tier": "high", "nodes": 2, "seconds": 40, "gpu_types": ("a100", "v100"),
            "script_partition": "gpu-a100"}
    return replay.TraceJob(**{**base, **kw})  # type: ignore[arg-type]


def test_by_hand_lists_every_partition_the_job_accepts() -> None:
    assert replay.hand_partition(_job()) == ("gpu-a100,gpu-v100", None)  # untyped gpu:2
    assert replay.hand_partition(_job(gpu_types=("v100",), script_partition="gpu-v100")) == ("gpu-v100", "v100")
    assert replay.hand_partition(_job(gpu_types=(), script_partition="cpu")) == ("cpu", None)


def test_by_hand_pool_has_the_tiers_but_no_checkpointing_qos() -> None:
    hand = desired_state(validate_policy_data(yaml.safe_load(replay.hand_policy(replay.POLICY)))).qos
    ours = desired_state(validate_policy_data(yaml.safe_load(replay.POLICY))).qos
    assert sorted(hand) == ["hrpool_critical", "hrpool_high", "hrpool_normal"]
    assert hand["hrpool_critical"].preempt == ("hrpool_high", "hrpool_normal")
    assert set(ours) - set(hand) == {"hrpool_critical_ckpt", "hrpool_high_ckpt", "hrpool_normal_ckpt"}


def test_a_checkpointing_job_runs_the_trace_script_and_asks_for_its_ckpt_qos(tmp_path: Path) -> None:
    job = _job(ckpt=True)
    argv = replay.sbatch_argv(job, "j", "gpu-a100,gpu-v100", None, True, run_dir=tmp_path / "j", ckpt_qos=True)
    assert "--qos=high_ckpt" in argv and f"--export=ALL,HETRUN_RUN_DIR={tmp_path / 'j'}" in argv
    assert argv[-1].startswith("exec ") and argv[-1].endswith(f"trace_job.py 40 --every {replay.CKPT_EVERY}")
    assert "--time=2" in argv  # 40 s + 15 s + its Python start, in whole minutes
    hand = replay.sbatch_argv(job, "j", "gpu-a100,gpu-v100", None, True, run_dir=tmp_path / "j")
    assert "--qos=high" in hand and hand[-1].startswith("exec ")
    sleep = replay.sbatch_argv(_job(), "j", "gpu-a100", "a100", True, run_dir=tmp_path / "j", ckpt_qos=True)
    assert "--qos=high" in sleep and sleep[-1] == "sleep 40"


def test_the_share_of_checkpointing_jobs_leaves_the_trace_alone() -> None:
    plain = replay.make_trace(14, 300, 150)
    marked = replay.mark_checkpointing(replay.make_trace(14, 300, 150), 0.5, 14)
    assert [(j.at, j.tier, j.nodes, j.seconds) for j in plain] == [(j.at, j.tier, j.nodes, j.seconds) for j in marked]
    assert 55 <= sum(j.ckpt for j in marked) <= 95
    assert not any(j.ckpt for j in replay.mark_checkpointing(replay.make_trace(14, 300, 150), 0.0, 14))


RUN = {"start": 100.0, "end": 150.0, "nodes": 4}  # sacct: preempted at 150 (its End)


def test_a_sleep_loses_its_whole_run() -> None:
    assert replay.work_lost(RUN, None) == 200.0
    assert replay.lost_span(RUN, None) == (100.0, 150.0, 4)


def test_a_checkpointing_job_loses_what_it_did_since_its_newest_save() -> None:
    # saves at 120 and 140; steps until 147, then preempted: 7 s x 4 nodes redone
    marks = {"saves": [120.0, 140.0, 190.0], "events": [101.0, 130.0, 147.0, 195.0]}
    assert replay.work_lost(RUN, marks, until=180.0) == 28.0
    assert replay.lost_span(RUN, marks, until=180.0) == (140.0, 150.0, 4)
    # the agreed stop: it saves after sacct's End (SIGTERM, then the stop) and exits
    stopped = {"saves": [120.0, 151.5], "events": [149.0, 151.5, 151.6]}
    assert replay.work_lost(RUN, stopped, until=180.0) == pytest.approx(0.4)  # 0.1 s, its exit
    assert replay.lost_span(RUN, stopped, until=180.0) == (150.0, 150.0, 4)
    # cut during its start-up: nothing saved, nothing done
    assert replay.work_lost(RUN, {"saves": [], "events": []}) == 0.0
    assert replay.lost_span(RUN, {"saves": [], "events": []}) == (100.0, 150.0, 4)


def test_useful_share_leaves_out_what_was_lost() -> None:
    t = 1000.0  # sacct times are epoch seconds
    runs = {"a": [{"submit": t, "eligible": t, "start": t, "end": t + 10, "nodes": 32, "state": "PREEMPTED"},
                  {"submit": t, "eligible": t + 12, "start": t + 20, "end": t + 30, "nodes": 32,
                   "state": "COMPLETED"}],
            "b": [{"submit": t, "eligible": t, "start": t + 10, "end": t + 20, "nodes": 64, "state": "COMPLETED"}]}
    raw, seconds = replay.share_from_sacct(runs)
    useful, _ = replay.share_from_sacct(runs, lost=[(t, t + 10, 32)])
    assert seconds == 18 and raw == round((10 * 32 + 8 * 64) / 18 / 64, 3)  # pending: b 0-9, a's rerun 12-19
    assert useful == round((8 * 64) / 18 / 64, 3)

"""The work-lost figures benchmarks/replay_hetrun_jobs.py reports for the hetrun jobs of the
64-node trace replay (issue 14: "hetrun jobs must lose none beyond their last checkpoint").

The run directory under tests/data/replay_hetrun/ was written by hetrun itself: the replay's
job spec (examples/ppo_cartpole.yaml made small, ``job_spec``; then 150 iterations, a
checkpoint every 10, 1 CPU per rank) run with ``hetrun submit --backend local``, stopped with
``hetrun preempt RUN --wait`` after iteration 45 (it stopped at 65), requeued and run to the end. Kept: events.jsonl, plan.json, run.json and the checkpoint
store's manifests (what the store lists; the tensors are left out). The variants below edit
copies of it the way a different preemption would have written them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import replay_hetrun_jobs as rh

RUN = Path(__file__).parent / "data" / "replay_hetrun" / "ppo-preempted"
# the recorded run: 150 iterations, a checkpoint every 10 (the replay's own job is longer)
INTERVAL = json.loads((RUN / "plan.json").read_text())["checkpoint"]["interval"]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _write_events(run_dir: Path, events: list[dict[str, Any]]) -> None:
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


@pytest.fixture
def run_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(RUN, tmp_path / "run"))


def _stop_step(run_dir: Path) -> int:
    """The step every rank checkpointed at the agreed stop (``reason: preempt``)."""
    [step] = {e["info"]["step"] for e in _events(run_dir) if e.get("ev") == "checkpoint"
              and e.get("reason") == "preempt"}
    return step


def test_the_recorded_preemption_lost_nothing_beyond_its_checkpoint() -> None:
    m = rh.measure_run(RUN)
    assert (m["attempts"], m["restarts"], m["finished"]) == (2, 1, True), m
    [r] = m["restarts_detail"]
    step = _stop_step(RUN)
    assert step >= 45
    for comp in ("learner", "rollout"):
        c = r["components"][comp]
        assert c["restore_state"] == "restored", c
        assert c["newest_checkpoint_before"] == c["restored_step"] == step, c
        assert c["last_completed_iteration"] is not None and c["last_completed_iteration"] + 1 >= step, c
        assert c["lost_beyond_checkpoint"] == 0
    assert r["lost_beyond_checkpoint"] == 0 == m["lost_beyond_checkpoint_max"]
    # the agreed stop checkpointed the step the ranks reached: hardly anything redone
    assert r["lost_since_checkpoint_iterations"] == max(
        c["last_completed_iteration"] + 1 - step for c in r["components"].values())
    assert m["checkpoints_written"] >= 2 * (step // INTERVAL)


def _as_if_killed_before_the_stop(run_dir: Path) -> tuple[int, int]:
    """The run as a SIGKILL before the agreed stop would have left it: no stop checkpoint
    (line and manifest gone), the restart restored the newest interval checkpoint."""
    stop = _stop_step(run_dir)
    interval = max(e["info"]["step"] for e in _events(run_dir) if e.get("ev") == "checkpoint"
                   and e.get("reason") == "interval" and e["info"]["step"] < stop)
    for manifest in run_dir.glob(f"ckpt/*/manifests/{stop:012d}.json"):
        manifest.unlink()
    out = []
    for e in _events(run_dir):
        if e.get("ev") == "checkpoint" and e.get("reason") == "preempt":
            continue
        if e.get("ev") == "restore":
            e = {**e, "step": interval, "iteration": interval}
        out.append(e)
    _write_events(run_dir, out)
    return stop, interval


def test_killed_before_the_stop_loses_the_iterations_since_the_interval_checkpoint(run_copy: Path) -> None:
    stop, interval = _as_if_killed_before_the_stop(run_copy)
    [r] = rh.measure_run(run_copy)["restarts_detail"]
    assert r["lost_beyond_checkpoint"] == 0
    assert {c["newest_checkpoint_before"] for c in r["components"].values()} == {interval}
    assert r["lost_since_checkpoint_iterations"] >= stop - interval > 0


def test_a_restart_behind_the_newest_checkpoint_is_counted_as_lost(run_copy: Path) -> None:
    """The figure can fail: a restore of an older step than the newest durable one."""
    step = _stop_step(run_copy)
    older = step - step % INTERVAL - INTERVAL  # an interval checkpoint before the stop
    _write_events(run_copy, [{**e, "step": older, "iteration": older} if e.get("ev") == "restore" else e
                             for e in _events(run_copy)])
    m = rh.measure_run(run_copy)
    assert m["restarts_detail"][0]["lost_beyond_checkpoint"] == step - older == m["lost_beyond_checkpoint_max"]
    assert rh.summarize({"j": {"rc": 0, **m}})["lost_beyond_checkpoint_max"] == step - older


def test_a_fresh_restart_after_checkpoints_loses_them_all(run_copy: Path) -> None:
    step = _stop_step(run_copy)
    _write_events(run_copy, [{**e, "step": None, "iteration": 0, "restored_state": False,
                              "fresh_reason": "test: no checkpoint loaded"} if e.get("ev") == "restore" else e
                             for e in _events(run_copy)])
    [r] = rh.measure_run(run_copy)["restarts_detail"]
    assert {c["restore_state"] for c in r["components"].values()} == {"fresh"}
    assert r["lost_beyond_checkpoint"] == step


def test_summary_lines_name_each_restart() -> None:
    m = rh.measure_run(RUN)
    result = {"jobs": {"trX-030-normal": {"rc": 0, "run_dir": str(RUN), **m}},
              "summary": rh.summarize({"trX-030-normal": {"rc": 0, **m}})}
    text = "\n".join(rh.summary_lines("policy_fit", result))
    assert "work lost beyond the last checkpoint: max 0 iteration(s)" in text, text
    assert "trX-030-normal restart 1" in text and f"restored {_stop_step(RUN)}" in text, text


def test_the_hetrun_jobs_join_the_trace_in_arrival_order() -> None:
    from dataclasses import dataclass

    @dataclass
    class Row:  # the fields of pool_trace_replay.TraceJob that add_to_trace sets
        i: int
        at: float
        tier: str
        nodes: int
        seconds: int
        gpu_types: tuple[str, ...]
        script_partition: str
        hetrun: bool = False

    trace = [Row(i, 10.0 * i, "high", 1, 5, (), "cpu") for i in range(10)]
    out = rh.add_to_trace(trace, 14, 100.0, 3)
    assert [j.at for j in out] == sorted(j.at for j in out)
    added = [j for j in out if j.hetrun]
    assert sorted(j.i for j in added) == [10, 11, 12] and {j.tier for j in added} == {"normal"}
    assert rh.add_to_trace(trace, 14, 100.0, 0) == trace


def test_the_job_spec_is_the_example_made_small_and_valid() -> None:
    from hetrun.dag.spec import spec_from_dict

    doc = rh.job_spec("trX-031-normal", partition="cpu", placement_auto=True)
    spec = spec_from_dict(doc)
    assert spec.workload == "hetrun.examples.ppo:PPOWorkload"
    assert spec.checkpoint.interval == rh.CKPT_EVERY
    assert {c.nodes for c in spec.components.values()} == {1}


def test_the_replay_counts_a_het_job_by_its_name_in_its_metrics() -> None:
    """pool_trace_replay's own trace and metrics with hetrun rows: the sleeps keep their rows
    (names), and a het job's two sacct records (one per component) both count."""
    import pool_trace_replay as ptr

    trace = ptr.make_trace(14, 60, 30)
    mixed = rh.add_to_trace(trace, 14, 60, 2)
    assert [j for j in mixed if not j.hetrun] == trace
    job = next(j for j in mixed if j.hetrun)
    name = f"trX-{job.i:03d}-normal"
    base = "2026-12-02T01:00:"
    dump = "\n".join([  # JobIDRaw|JobName|State|Submit|Eligible|Start|End|NNodes, as sacct -D -X -P prints
        f"41|{name}|PREEMPTED|{base}00|{base}00|{base}01|{base}11|1",
        f"42|{name}|PREEMPTED|{base}00|{base}00|{base}01|{base}11|1",
        f"41|{name}|COMPLETED|{base}11|{base}41|{base}41|{base}59|1",
        f"42|{name}|COMPLETED|{base}11|{base}41|{base}41|{base}59|1"])
    runs = ptr.parse_sacct(dump, "trX-")
    m = ptr.metrics([job], {job.i: name}, runs, [])
    assert m["jobs_seen"] == 1 and m["jobs_preempted"] == 1
    assert m["wait_s"]["normal"] == {"p50": 1.0, "p95": 1.0, "n": 1}
    assert m["work_lost_node_s"] == 20.0  # two components x 10 s cut short
    assert rh.sacct_view(runs[name]) == {"queue_wait_s": 1.0,
                                         "sacct_states": ["PREEMPTED", "PREEMPTED", "COMPLETED", "COMPLETED"]}

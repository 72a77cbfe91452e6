"""The runtime with real Open MPI ranks: 2 learners + 2 rollout ranks, a real torch model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hetrun.runtime.events import read_events
from runtime_toy import mpi_env, mpirun_cmd, toy_plan, write_run_dir

pytestmark = pytest.mark.mpi


def _run(tmp_path: Path, plan: dict, timeout: float = 240) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    run_dir = write_run_dir(tmp_path / "run", plan)
    env = mpi_env()
    env["HETRUN_COLLECTIVE_TIMEOUT"] = "90"
    t0 = time.monotonic()
    proc = subprocess.run(mpirun_cmd(run_dir, plan), env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, list(read_events(run_dir)), time.monotonic() - t0


def _actions(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ev"] == "action"]


def test_pipelined_run_trains_and_records_every_action(tmp_path: Path) -> None:
    iterations = 12
    plan = toy_plan(iterations=iterations, pipeline_window=2, tolerance=1)
    proc, events, _ = _run(tmp_path, plan)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    starts = [e for e in events if e["ev"] == "start"]
    assert sorted(e["rank"] for e in starts) == [0, 1, 2, 3]
    assert {e["component"] for e in starts} == {"learner", "rollout"}
    for rank in range(4):
        assert f"hetrun.runtime: rank {rank}/4 component" in proc.stdout

    acts = _actions(events)
    # Every template action of every rank, each iteration it is scheduled for.
    comp_of = {e["rank"]: e["component"] for e in starts}
    for rank, comp in comp_of.items():
        for a in plan["actions"]:
            if a["component"] != comp:
                continue
            want = [i for i in range(iterations) if (i + 1) % a["every"] == 0]
            got = sorted(e["iteration"] for e in acts if e["rank"] == rank and e["id"] == a["id"])
            assert got == want, (rank, a["id"], got)
    for e in acts:
        assert e["end"] >= e["start"] and e["peak_mem"] > 0 and e["node"]

    # The loss falls (real SGD on the learner).
    evals = sorted((e["iteration"], e["metrics"]["loss"]) for e in acts
                   if e["type"] == "eval" and e["rank"] == 0)
    assert len(evals) == iterations // 3
    assert evals[-1][1] < 0.5 * evals[0][1], evals

    # Gradients were averaged across the two learners: identical weights.
    w0 = {}
    for e in acts:
        if e["id"] == "sync.grads+optimize":
            w0.setdefault(e["iteration"], set()).add(round(e["metrics"]["w0"], 6))
    assert all(len(v) == 1 for v in w0.values()), w0
    # ...by a bucketed all-reduce launched from the autograd hooks of the last backward.
    syncs = [e for e in acts if e["type"] == "sync" and e.get("part_of")]
    assert len(syncs) == 2 * iterations
    assert all(e["launched_in_backward"] == e["buckets"] == 1 and e["bytes"] == 32 for e in syncs)

    # Rollouts ran on weights at most one version stale (tolerance 1) and did get new weights.
    rollouts = [e for e in acts if e["type"] == "rollout"]
    assert all(e["policy_version"] >= e["iteration"] - 1 for e in rollouts)
    assert max(e["policy_version"] for e in rollouts) >= iterations - 3
    # Batches moved point to point: bytes recorded on the rollout and weight-sync actions.
    assert all(e["bytes"] > 0 for e in rollouts)
    assert any(e["bytes"] > 0 for e in acts if e["id"] == "sync.policy")
    # Components still overlap under the per-iteration stop agreement: some
    # rollout of iteration i+1 starts before the learners' work on i ends.
    learner_end: dict[int, float] = {}
    for e in acts:
        if e["component"] == "learner":
            learner_end[e["iteration"]] = max(learner_end.get(e["iteration"], 0.0), e["end"])
    assert any(e["start"] < learner_end.get(e["iteration"] - 1, 0.0) for e in rollouts)
    # One tiny agreement per iteration, nothing stopped, no duplicate restore lines.
    assert not [e for e in events if e["ev"] in ("preempt", "restore")]


def test_coarse_mode_is_synchronous(tmp_path: Path) -> None:
    plan = toy_plan(iterations=6, mode="coarse", learners=1, rollouts=2)
    proc, events, _ = _run(tmp_path, plan)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rollouts = [e for e in _actions(events) if e["type"] == "rollout"]
    assert len(rollouts) == 12
    # Rollout i always runs on the weights of optimize(i-1): version == i.
    assert all(e["policy_version"] == e["iteration"] for e in rollouts), rollouts
    # ...and so never overlaps the learner's work on the previous iteration.
    learner_end = {e["iteration"]: e["end"] for e in _actions(events) if e["id"] == "sync.policy"}
    for e in rollouts:
        if e["iteration"] > 0:
            assert e["start"] >= learner_end[e["iteration"] - 1] - 1e-3


@pytest.mark.parametrize("component", ["rollout", "learner"])
def test_failing_rank_ends_the_job_and_is_named(tmp_path: Path, component: str) -> None:
    plan = toy_plan(iterations=50, workload_args={"fail_at": 3, "fail_component": component})
    proc, events, wall = _run(tmp_path, plan, timeout=200)
    assert proc.returncode != 0
    # The injected failure is the first error; a peer in a collective with the
    # dead rank may report its own broken connection before MPI_Abort lands.
    errors = sorted((e for e in events if e["ev"] == "error"), key=lambda e: e["time"])
    assert errors and len(errors) <= 2, errors
    err = errors[0]
    assert err["component"] == component and err["iteration"] == 3
    assert "toy failure injected at iteration 3" in err["error"]
    assert "Traceback" in err["traceback"]
    failing_rank = err["rank"]
    assert f"rank {failing_rank} ({component})" in proc.stderr
    # Nobody ran on to the end: the job was taken down, not left waiting.
    assert not any(e["ev"] == "exit" for e in events)
    assert max(e["iteration"] for e in _actions(events)) < 50
    # Well inside the 90 s collective timeout (start-up of 4 torch ranks included).
    assert wall < 90, wall


def test_plan_with_nothing_to_run_exits_zero(tmp_path: Path) -> None:
    plan = toy_plan(iterations=1)
    plan["actions"] = [a for a in plan["actions"] if a["component"] == "learner"][:0]
    plan["order"] = []
    run_dir = write_run_dir(tmp_path / "run", plan)
    # Plan.from_json may reject an empty template; the runtime must not crash either way.
    proc = subprocess.run(mpirun_cmd(run_dir, plan), env=mpi_env(), capture_output=True,
                          text=True, timeout=120)
    events = list(read_events(run_dir))
    if proc.returncode == 0:
        assert sorted(e["rank"] for e in events if e["ev"] == "start") == [0, 1, 2, 3]
        assert all(e["code"] == 0 for e in events if e["ev"] == "exit")
    else:
        assert "hetrun.runtime: error:" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_truncated_event_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"ev": "start", "rank": 0}) + "\n" + '{"ev": "act')
    assert [e["ev"] for e in read_events(tmp_path)] == ["start"]


def test_node_local_weight_fan_out(tmp_path: Path) -> None:
    """HETRUN_SHARED_WEIGHTS=1: the learner sends each version once per node; the node's
    rollout ranks read it from one MPI shared-memory window."""
    import torch
    from hetrun.runtime.comms.p2p import pack

    iterations = 8
    plan = toy_plan(iterations=iterations, learners=1, rollouts=3,
                    env={"OMP_NUM_THREADS": "1", "HETRUN_SHARED_WEIGHTS": "1"})
    proc, events, _ = _run(tmp_path, plan)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shared = [e for e in events if e["ev"] == "shared_weights"]
    assert sorted(e["rank"] for e in shared) == [1, 2, 3]
    assert all(e["group_size"] == 3 and e["leader"] == 1 for e in shared)
    acts = _actions(events)
    # One message per version on the wire (to the node's first rollout rank), not three.
    for e in acts:
        if e["id"] == "sync.policy":
            one = pack("state", "sync.policy", e["iteration"], {"w": torch.zeros(8, 1)},
                       {"version": e["iteration"] + 1}).size
            assert e["bytes"] == one, e
    rollouts = [e for e in acts if e["type"] == "rollout"]
    assert len(rollouts) == 3 * iterations
    assert all(e["policy_version"] >= e["iteration"] - 1 for e in rollouts)
    assert max(e["policy_version"] for e in rollouts) >= iterations - 3
    evals = [e["metrics"]["loss"] for e in acts if e["type"] == "eval"]
    assert evals[-1] < evals[0]

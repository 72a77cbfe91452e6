"""A node that failed comes back and serves as a spare again (issue 25), on the shared local
Slurm cluster (no node is killed, only ranks: the cluster's other users see nothing).

A PPO job (the examples' workload with a pause per update, tests/resume_slow_workloads.py:
learner on one node, rollout on one node + ``spare_nodes: 1``). Its rollout rank is SIGKILLed:
the batch script excludes that node (a rank died there) and restarts on the spare. The rank on
the spare is SIGKILLed in turn: no spare is left, so before the queue the script asks whether an
excluded node answers again. The first node still belongs to the job and its slurmd answers a
probe step: it is taken back (once; the event says so) and the job finishes inside its
allocation. Without the taking back the second failure requeues the job (the assertion on the
second ``node_failure``'s action fails).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from resume_compare import example_spec
from test_resume_exact import events

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HERE = Path(__file__).parent


def _rollout_start(run_dir: Path, restart: int) -> dict[str, Any] | None:
    return next((e for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == "rollout"
                 and e.get("restart_count", 0) == restart), None)


def _learner_iterations(run_dir: Path, restart: int) -> int:
    """Learner iterations started in attempt ``restart`` (action events carry no restart count:
    those that began after the attempt's learner started)."""
    since = next((e["time"] for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == "learner"
                  and e.get("restart_count", 0) == restart), None)
    if since is None:
        return 0
    return len({e["iteration"] for e in events(run_dir) if e.get("ev") == "action"
                and e.get("component") == "learner" and e.get("start", 0) >= since})


def test_an_excluded_node_that_answers_again_is_taken_back_when_no_spare_is_left(  # type: ignore[no-untyped-def]
        slurm_cluster, shared_tmp: Path) -> None:
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.rundir import wait_for
    from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

    job_dir = shared_tmp / "job"
    job_dir.mkdir()
    shutil.copy(HERE / "resume_slow_workloads.py", job_dir / "resume_slow_workloads.py")
    doc = example_spec(
        "ppo_cartpole", workload="resume_slow_workloads:SlowPPO",
        workload_args={"num_envs": 4, "num_steps": 32, "hidden": 16, "eval_episodes": 2, "pause": 0.2},
        components={"rollout": {"nodes": 1, "spare_nodes": 1, "mem": "500M"}, "learner": {"mem": "1G"}},
        training={"iterations": 60, "eval_interval": 20},
        checkpoint={"interval": 1000, "keep": 3, "memory_every": 1},
        preemption={"max_failures": 3},
        slurm={"partition": "debug", "time": "00:10:00"},
        env={"OMP_NUM_THREADS": "1", "HETRUN_JOB_DIR": str(job_dir), "HETRUN_NODE_TIMEOUT": "4",
             "HETRUN_MEMORY_DIR": "/tmp"})
    res = submit_spec(spec_from_dict(doc), backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)
    victims = []
    try:
        for restart in (0, 1):
            assert wait_for(lambda r=restart: _rollout_start(run_dir, r) is not None
                            and _learner_iterations(run_dir, r) >= 4, 240, 0.3), events(run_dir)[-5:]
            start = _rollout_start(run_dir, restart)
            assert start is not None
            victims.append(start["node"])
            os.kill(int(start["pid"]), signal.SIGKILL)  # the rank only: its node lives on
            assert wait_for(lambda n=restart + 1: len([e for e in events(run_dir) if e.get("ev") == "node_failure"])
                            >= n, 120, 0.3), events(run_dir)[-5:]
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=1)
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], capture_output=True)
    first, second = [e for e in events(run_dir) if e.get("ev") == "node_failure"]
    assert victims[0] != victims[1], victims  # the restart went to the spare
    assert (first["dead_nodes"], first["action"], first.get("returned")) == ([victims[0]], "restart", []), first
    assert (second["dead_nodes"], second["action"], second["returned"]) == ([victims[1]], "restart", [victims[0]]), second
    assert f"taken back: {victims[0]} answered a probe step again" in second["reason"], second
    rollout = next(c for c in second["components"] if c["component"] == "rollout")
    assert rollout["new"] == [victims[0]] and victims[0] not in second["excluded"], second
    assert {c.state for c in final.components} == {"COMPLETED"}, final
    # Inside the allocation throughout: three attempts, one job, no requeue.
    starts = {e.get("restart_count", 0) for e in events(run_dir) if e.get("ev") == "start"}
    assert starts == {0, 1, 2}, starts
    assert _learner_iterations(run_dir, 2) > 0
    returned_file = run_dir / "logs" / f".dead-nodes-{res.run.job_id}.returned"
    assert returned_file.read_text().split() == [victims[0]]
    # What status and report print for it.
    from hetrun.reports.node_failures import node_failure_lines

    lines = node_failure_lines(run_dir)
    assert len(lines) == 2 and "taken back" in lines[1] and f"rollout: {victims[1]} -> {victims[0]}" in lines[1], lines

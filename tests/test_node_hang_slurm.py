"""A rank that hangs instead of dying is named and its node replaced (issue 25), on a real
Slurm cluster of its own.

One run: a small PPO job (learner and rollout on one node each plus ``spare_nodes: 1`` each,
the memory tier every iteration, ``HETRUN_COLLECTIVE_TIMEOUT: 8``) on a throw-away 4-node
cluster (tests/node_cluster.py). Mid-run the rollout rank is SIGSTOPped: its process and its
node's heartbeat live on, so the heartbeat monitor sees nothing. The learner's wait for the
rollout's data times out and names the rank it waited for (``waiting_on``); the batch script
then excludes the hung rank's node, not the learner's, restarts on the rollout's spare inside
the allocation from peer memory, and the job ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from resume_compare import assert_same_checkpoints, example_spec
from test_resume_exact import events

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERATIONS = 100
STOP_AFTER = 10  # learner iterations before the rollout rank is stopped
TIMEOUT_S = 8  # HETRUN_COLLECTIVE_TIMEOUT: the documented detection of a hung rank


def _spec(memory_dir: str) -> dict[str, Any]:
    return example_spec(
        "ppo_cartpole",
        workload_args={"num_envs": 4, "num_steps": 32, "eval_episodes": 2},
        components={"rollout": {"nodes": 1, "spare_nodes": 1, "mem": "500M"},
                    "learner": {"mem": "1G", "spare_nodes": 1}},
        training={"iterations": ITERATIONS, "eval_interval": 10},
        checkpoint={"interval": 1000, "keep": 3, "memory_every": 1},
        preemption={"max_failures": 2},
        slurm={"partition": "debug", "time": "00:10:00"},
        env={"OMP_NUM_THREADS": "1", "HETRUN_MEMORY_DIR": memory_dir,
             "HETRUN_COLLECTIVE_TIMEOUT": str(TIMEOUT_S)},
    )


@pytest.fixture(scope="module")
def hung_run(slurm_cluster) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.rundir import wait_for
    from hetrun.slurm_plugin.submit import wait_for_end
    from node_cluster import job_beside_reference

    with job_beside_reference(_spec, "node-hang") as job:
        run_dir = job["run_dir"]
        assert wait_for(lambda: job["started"](STOP_AFTER), 300, 0.5), events(run_dir)[-5:]
        rollout = next(e for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == "rollout")
        os.kill(int(rollout["pid"]), signal.SIGSTOP)  # hangs: its process and its node's heartbeat live on
        stopped_at = time.time()
        # (the stopped rank is SIGKILLed with the step at the restart, or by the cluster's stop)
        final = wait_for_end(job["res"].run, SbatchBackend(), timeout_s=300, poll_s=1)
        yield {"run_dir": run_dir, "reference": job["ref"], "victim": rollout["node"], "rank": rollout["rank"],
               "stopped_at": stopped_at, "final": final, "events": events(run_dir)}


def test_the_waiting_rank_names_the_hung_one(hung_run: dict[str, Any]) -> None:
    [f] = [e for e in hung_run["events"] if e.get("ev") == "rank_failure" and e.get("restart_count") == 0
           and e.get("detected_by") == "runtime"]
    assert f["component"] == "learner" and f["waiting_on"] == [hung_run["rank"]], f
    assert f"from rank(s) {hung_run['rank']} (rollout)" in f["message"], f


def test_the_hung_ranks_node_is_replaced_not_the_waiters(hung_run: dict[str, Any]) -> None:
    final = hung_run["final"]
    assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], final
    assert all(c.restarts == 0 for c in final.components), final  # inside the allocation
    [nf] = [e for e in hung_run["events"] if e.get("ev") == "node_failure"]
    assert nf["dead_nodes"] == [hung_run["victim"]] and nf["action"] == "restart", nf
    assert f"rank {hung_run['rank']} (rollout) hung there" in nf["reason"], nf
    learner = next(c for c in nf["components"] if c["component"] == "learner")
    assert learner["new"] == learner["old"], nf  # the waiting learner's node is not blamed
    # Detected by the documented timeout: no decision before it ran out.
    assert nf["time"] - hung_run["stopped_at"] >= TIMEOUT_S, nf


def test_it_ends_bit_identical_to_an_uninterrupted_run(hung_run: dict[str, Any]) -> None:
    restores = [e for e in hung_run["events"] if e.get("ev") == "restore" and e.get("restart_count") == 1]
    assert {e["source"] for e in restores} == {"memory"}, restores
    plan = json.loads((hung_run["reference"] / "plan.json").read_text())
    ranks = {c["name"]: c["ntasks"] for c in plan["components"]}
    assert_same_checkpoints(hung_run["reference"], hung_run["run_dir"], ranks, ITERATIONS)

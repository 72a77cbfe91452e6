"""A node dies, the job goes on (issue 25), on a real Slurm cluster of its own.

One run shared by every assertion: a small PPO job (learner and rollout on one node
each plus ``spare_nodes: 1`` each, the memory tier on: every iteration) on a
throw-away 4-node cluster (tests/node_cluster.py: its nodes may be killed, which
the shared cluster's other users must never see). Mid-run every process of the
rollout's node is SIGKILLed (slurmd, slurmstepd, the rank: its private /tmp, where
the memory tier lives, goes with them). The job's own batch script must start a
new step on the survivor plus the spare, without the queue; every rank restores
from peer memory (the dead rank's replica on the learner's node); the run ends
bit-identical to an uninterrupted run of the same plan (real Open MPI ranks, no
kill), and the events say what happened. The killed node is set DOWN while the job
still runs, as Slurm does after SlurmdTimeout: the job runs on inside its allocation.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from resume_compare import assert_same_checkpoints, example_spec
from test_resume_exact import events

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERATIONS = 120  # long enough for the warm servers (runtime/warm_start.py) to be up before the kill
KILL_AFTER = 10  # iterations the learner has started before the kill


def _spec(memory_dir: str) -> dict[str, Any]:
    spec = example_spec(
        "ppo_cartpole",
        workload_args={"num_envs": 4, "num_steps": 32, "eval_episodes": 2},
        # The learner leads the het job: with a spare of its own it holds two nodes, so Slurm
        # marking the rollout's dead node down removes the node and leaves the job running
        # (with one node Slurm requeues the whole het job: docs/PREEMPTION.md).
        components={"rollout": {"nodes": 1, "spare_nodes": 1, "mem": "500M"},
                    "learner": {"mem": "1G", "spare_nodes": 1}},
        training={"iterations": ITERATIONS, "eval_interval": 10},
        # No interval checkpoint before the end: the restart can only come from memory.
        # memory_every 1 (not adaptive): the work lost asserted below does not depend on the load.
        checkpoint={"interval": 1000, "keep": 3, "memory_every": 1},
        preemption={"max_failures": 2},
        slurm={"partition": "debug", "time": "00:10:00"},
        # A node's heartbeat unchanged for 4 s means dead (the default, set here so the test
        # does not follow a change of it), so the restart beats SlurmdTimeout.
        env={"OMP_NUM_THREADS": "1", "HETRUN_MEMORY_DIR": memory_dir, "HETRUN_NODE_TIMEOUT": "4"},
    )
    return spec


def _mark_down_once_ended(cluster: Any, job_id: str, node: str, timeout: float = 120) -> None:
    """Once the job's batch script has ended (no component RUNNING), set the killed node
    DOWN, as Slurm itself does after SlurmdTimeout (300 s here): until then the component
    that ran on it stays COMPLETING, since no slurmd there confirms its end. (This module's
    own job has the node set down while it runs: its leader holds two nodes.)"""
    from hetrun.slurm_plugin.rundir import wait_for

    def batch_ended() -> bool:
        # Only Slurm's word counts: a squeue that failed (slurmctld busy) says nothing, and
        # setting the node down while the job still runs would end the whole job.
        out = cluster.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        if out.returncode != 0:
            return "Invalid job id" in out.stderr
        states = out.stdout.split()
        return "RUNNING" not in states and "PENDING" not in states

    assert wait_for(batch_ended, timeout, 0.5), cluster.run("squeue", "-j", job_id, check=False).stdout
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=killed_by_test")


@pytest.fixture(scope="module")
def killed_run(slurm_cluster) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.rundir import wait_for
    from hetrun.slurm_plugin.submit import wait_for_end
    from node_cluster import job_beside_reference

    with job_beside_reference(_spec, "node-death") as job:
        run_dir, cluster, started = job["run_dir"], job["cluster"], job["started"]

        def warm_servers() -> int:  # runtime/warm_start.py: one per node of the allocation
            return sum("serves" in p.read_text() for p in (run_dir / "logs").glob("hetrun-warm-*.out"))

        assert wait_for(lambda: started(KILL_AFTER), 300, 0.5), events(run_dir)[-5:]
        assert wait_for(lambda: warm_servers() == 4, 120, 0.2), list((run_dir / "logs").iterdir())
        assert not started(ITERATIONS - 30), "the warm servers came up too late to test their restart"
        victim = next(e["node"] for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == "rollout")
        killed_at = time.time()
        assert cluster.kill_node(victim), victim
        # Slurm marks the node down while the job runs on (after SlurmdTimeout, 300 s here, or
        # an administrator): set once the restart has begun.
        assert wait_for(lambda: any(e.get("ev") == "node_failure" for e in events(run_dir)), 120, 0.2), \
            events(run_dir)[-5:]
        cluster.run("scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=killed_by_test")
        down_at = time.time()
        final = wait_for_end(job["res"].run, SbatchBackend(), timeout_s=300, poll_s=1)
        status = subprocess.run(["hetrun", "status", str(run_dir)], capture_output=True, text=True,
                                env={**os.environ, "COLUMNS": "220"})
        yield {"run_dir": run_dir, "reference": job["ref"], "victim": victim, "killed_at": killed_at,
               "down_at": down_at, "final": final,
               "events": events(run_dir), "status": status}


def _batch_logs(run_dir: Any) -> str:
    """The batch script's and srun's logs, for a failed assertion (the run directory goes with
    the module's throw-away cluster: a failure seen once in the suite could not be read after)."""
    return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
                     for p in sorted((run_dir / "logs").glob("*.err")) + sorted((run_dir / "logs").glob("batch-*.out")))


def test_the_job_finishes_inside_its_allocation(killed_run: dict[str, Any]) -> None:
    final = killed_run["final"]
    assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], (final, _batch_logs(killed_run["run_dir"]))
    assert all(c.restarts == 0 for c in final.components), final  # never went back to the queue
    # ... and it trained on after Slurm was told the node is down.
    assert any(e.get("ev") == "action" and e.get("end", 0) > killed_run["down_at"]
               for e in killed_run["events"]), killed_run["events"][-5:]
    failures = [e for e in killed_run["events"] if e.get("ev") == "node_failure"]
    assert len(failures) == 1, failures
    f = failures[0]
    assert f["dead_nodes"] == [killed_run["victim"]] and f["action"] == "restart", f
    rollout = next(c for c in f["components"] if c["component"] == "rollout")
    assert rollout["replaced"] == [{"dead": killed_run["victim"], "by": rollout["new"][0]}], f
    assert rollout["spares_left"] == 0, f


def test_every_rank_restores_from_peer_memory(killed_run: dict[str, Any]) -> None:
    evs = killed_run["events"]
    restores = [e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == 1]
    assert len(restores) == 2, restores
    assert {e["source"] for e in restores} == {"memory"}, restores
    assert len({e["step"] for e in restores}) == 1, restores
    learner_node = next(e["node"] for e in evs if e.get("ev") == "start" and e.get("component") == "learner")
    dead_rank = next(e for e in restores if e["component"] == "rollout")
    # The dead node's own copy is gone: its replica on the learner's node was used.
    assert (dead_rank["from_node"], dead_rank["from_kind"]) == (learner_node, "replica"), dead_rank
    assert all(e["work_lost"] is not None and e["work_lost"] <= 2 for e in restores), restores
    used = [e for e in evs if e.get("ev") == "memory_restore" and e.get("used")]
    assert len(used) == 2 and not any(e["rejected"] for e in used), used


def test_the_restarted_ranks_fork_from_the_warm_servers(killed_run: dict[str, Any]) -> None:
    """runtime/warm_start.py: the new step's ranks, on the survivor and the spare, start from
    their node's warm server (torch imported), not a fresh interpreter."""
    starts = [e for e in killed_run["events"] if e.get("ev") == "startup"]
    assert [e["warm_start"] for e in starts if e.get("restart_count") == 0] == [False, False], starts
    again = [e for e in starts if e.get("restart_count") == 1]
    assert len(again) == 2 and all(e["warm_start"] for e in again), again
    # Forked: the rank's own CPU seconds at startup (a forked child's count starts at the fork;
    # a cold rank spends 1.7-1.8 CPU-s importing torch here), not wall time, which load stretches.
    assert all(e["cpu_s"] < 1.0 for e in again), again


def test_it_ends_bit_identical_to_an_uninterrupted_run(killed_run: dict[str, Any]) -> None:
    plan = json.loads((killed_run["reference"] / "plan.json").read_text())
    ranks = {c["name"]: c["ntasks"] for c in plan["components"]}
    assert_same_checkpoints(killed_run["reference"], killed_run["run_dir"], ranks, ITERATIONS)


def test_status_says_what_happened(killed_run: dict[str, Any]) -> None:
    out = killed_run["status"]
    assert out.returncode == 0, out.stderr
    assert killed_run["victim"] in out.stdout, out.stdout
    assert "memory" in out.stdout, out.stdout
    from hetrun.reports.node_failures import node_failure_lines

    [line] = node_failure_lines(killed_run["run_dir"])
    assert line.endswith("ranks started warm: 2 of 2"), line
    # `hetrun report`'s line for the tier's cost: memory_every 1 is fixed, nothing capped.
    from hetrun.reports.node_failures import memory_tier_summary

    tier = memory_tier_summary(killed_run["run_dir"])
    assert tier and tier.startswith("memory tier: a snapshot every 1 iteration(s) (fixed); "), tier
    assert "of the training thread at most (rank " in tier and "budget" not in tier, tier

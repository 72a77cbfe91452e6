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
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from resume_compare import assert_same_checkpoints, example_spec, plan_dict
from test_resume_exact import events, mpirun

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
def hung_run(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.rundir import wait_for
    from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
    from node_cluster import NodeCluster

    root = Path("/var/tmp/hetrun-tests") / f"node-hang-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    ref = root / "reference"  # the same plan, uninterrupted, under mpirun, while the cluster boots
    ref.mkdir()
    (ref / "plan.json").write_text(json.dumps(plan_dict(_spec(str(root / "ref-mem")))))
    old_mem = os.environ.get("HETRUN_MEMORY_DIR")
    os.environ["HETRUN_MEMORY_DIR"] = str(root / "ref-mem")
    try:
        reference = mpirun(ref, 0)
    finally:
        os.environ.pop("HETRUN_MEMORY_DIR") if old_mem is None else os.environ.update(HETRUN_MEMORY_DIR=old_mem)

    cluster = NodeCluster()
    old_conf = os.environ.get("SLURM_CONF")
    stopped: int | None = None
    try:
        cluster.start()
        try:
            assert reference.wait(timeout=300) == 0, (ref / "mpirun-0.log").read_text()[-3000:]
        finally:
            if reference.poll() is None:
                os.killpg(reference.pid, signal.SIGKILL)
        os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
        res = submit_spec(spec_from_dict(_spec("/tmp")), backend="sbatch", runs_dir=root / "runs")
        run_dir = Path(res.run.run_dir)

        def started(it: int) -> bool:
            return any(e.get("ev") == "action" and e.get("component") == "learner"
                       and e.get("iteration", -1) >= it for e in events(run_dir))

        assert wait_for(lambda: started(STOP_AFTER), 300, 0.5), events(run_dir)[-5:]
        rollout = next(e for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == "rollout")
        stopped = int(rollout["pid"])
        os.kill(stopped, signal.SIGSTOP)  # hangs: its process and its node's heartbeat live on
        stopped_at = time.time()
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=1)
        yield {"run_dir": run_dir, "reference": ref, "victim": rollout["node"], "rank": rollout["rank"],
               "stopped_at": stopped_at, "final": final, "events": events(run_dir)}
    finally:
        if stopped is not None:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        os.environ.pop("SLURM_CONF", None) if old_conf is None else os.environ.update(SLURM_CONF=old_conf)
        cluster.stop()
    if not os.environ.get("HETRUN_KEEP_TEST_DIRS"):
        shutil.rmtree(root, ignore_errors=True)


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

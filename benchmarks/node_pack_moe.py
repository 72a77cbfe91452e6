"""The MoE LM packed after a node death (issue 25, ``min_nodes``): time to the first resumed
step, where the state came from, and whether the run ends bit-identical to an uninterrupted one.
Results: benchmarks/node_death.md (session 27).

    flock /var/lock/hetrun-heavy.lock python3 benchmarks/node_pack_moe.py --out benchmarks/results/node_pack_moe_s27.json

examples/moe_lm.yaml with ``learner: {min_nodes: 1}`` and no spare anywhere (learner 2 nodes x 2
ranks, evaluator 1 node), memory tier every iteration, on tests/node_cluster.py's throw-away
4-node cluster. Once the learner has started iteration ``--kill-at``, every process of its
second node (not the first: it runs the batch script) is SIGKILLed and, once the restart is
decided, the node set DOWN as Slurm would after SlurmdTimeout. The job's batch script restarts
inside the allocation with the learner's 4 ranks on its one node left. The reference: the same
plan run uninterrupted under mpirun on this host first; every rank's final checkpoint is compared
key by key (tests/resume_compare.py), and the keys that differ are listed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from node_cluster import NodeCluster  # noqa: E402
from resume_compare import differences, example_spec, plan_dict, stored  # noqa: E402
from test_resume_exact import events, mpirun  # noqa: E402

BASE = Path("/var/tmp/hetrun-bench/node_pack_moe")


def spec(iterations: int, memory_dir: str) -> dict[str, Any]:
    return example_spec(
        "moe_lm",
        components={"learner": {"min_nodes": 1, "mem": "1G"}, "evaluator": {"mem": "500M"}},
        training={"iterations": iterations, "eval_interval": 1000000},
        checkpoint={"interval": 1000, "keep": 3, "memory_every": 1},
        preemption={"max_failures": 2},
        slurm={"partition": "debug", "time": "00:20:00"},
        env={"OMP_NUM_THREADS": "1", "HETRUN_MEMORY_DIR": memory_dir},
    )


def wait(cond: Any, timeout: float, poll: float = 0.2) -> Any:
    end = time.time() + timeout
    while time.time() < end:
        if got := cond():
            return got
        time.sleep(poll)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--kill-at", type=int, default=10, help="learner iteration started before the kill")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "node_pack_moe.json")
    args = p.parse_args()
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

    root = BASE / time.strftime("%Y%m%d-%H%M%S")
    ref = root / "reference"
    ref.mkdir(parents=True)
    (ref / "plan.json").write_text(json.dumps(plan_dict(spec(args.iterations, str(root / "ref-mem")))))
    os.environ["HETRUN_MEMORY_DIR"] = str(root / "ref-mem")
    assert mpirun(ref, 0).wait(timeout=900) == 0, (ref / "mpirun-0.log").read_text()[-3000:]
    del os.environ["HETRUN_MEMORY_DIR"]
    result: dict[str, Any] = {"started": time.strftime("%H:%M:%S", time.gmtime()), "load_before": os.getloadavg()}
    cluster = NodeCluster()
    cluster.start()
    try:
        os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
        res = submit_spec(spec_from_dict(spec(args.iterations, "/tmp")), backend="sbatch", runs_dir=root / "runs")
        run_dir = Path(res.run.run_dir)
        assert wait(lambda: any(e.get("ev") == "action" and e.get("component") == "learner"
                                and e.get("iteration", -1) >= args.kill_at for e in events(run_dir)), 300)
        nodes = sorted({e["node"] for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == "learner"})
        victim = nodes[-1]
        t0 = time.time()
        cluster.kill_node(victim)
        assert wait(lambda: any(e.get("ev") == "node_failure" for e in events(run_dir)), 300)
        cluster.run("scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=node_pack_moe")
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=900, poll_s=1)
        evs = events(run_dir)
        restores = [e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == 1]
        t_restored = max(e["time"] for e in restores)
        first = min(e["end"] for e in evs if e.get("ev") == "action" and e.get("end", 0) > t_restored)
        nf = next(e for e in evs if e.get("ev") == "node_failure")
        plan = json.loads((ref / "plan.json").read_text())
        diffs = {f"{c['name']}/{r}": differences(stored(ref, c["name"], r, args.iterations),
                                                 stored(run_dir, c["name"], r, args.iterations))
                 for c in plan["components"] for r in range(c["ntasks"])}
        result.update(
            states=[c.state for c in final.components], victim=victim, learner_nodes=nodes,
            decided_s=round(nf["time"] - t0, 3), first_step_s=round(first - t0, 3),
            reason=nf["reason"], packed=[c.get("packed") for c in nf["components"]],
            restores=[{k: e.get(k) for k in ("rank", "node", "source", "from_node", "work_lost")} for e in restores],
            differing_keys={k: len(v) for k, v in diffs.items()},
            differing_groups={k: sorted({"/".join(x.split("/")[:3]) for x in v}) for k, v in diffs.items() if v},
            bit_identical=not any(diffs.values()))
    finally:
        cluster.stop()
    result["load_after"] = os.getloadavg()
    result["ended"] = time.strftime("%H:%M:%S", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps([*prev, result], indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

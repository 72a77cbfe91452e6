"""One memory-tier snapshot's cost on the training thread, in one process, with the caches as a
training step leaves them: the PPO example's learner (and its rollout rank) runs one update between
snapshots, then the snapshot is taken the way the executor takes it (runtime/recovery.py
``snapshot_tree``, the tier's encoder, the node-local tier's write). No MPI and no replicas: the
job's figures (the tier's share of a run, with the replicas' send and receipt) are
``node_death_bench.py --overhead-only``'s; this is the part of them one process can show.

    python3 benchmarks/memory_snapshot_cost.py --rounds 150 --json benchmarks/results/memory_snapshot_cost.json

Prints ms per snapshot (median over the rounds after the first 20): the tree's capture (the
workload's ``state_dict()`` and the RNG states), the encode, the tmpfs write, and the thread's CPU
for all three. Results: benchmarks/node_death.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

WARMUP = 20


def measure(rounds: int) -> dict[str, Any]:
    import torch
    from hetrun.examples.ppo import PPOWorkload
    from hetrun.runtime import recovery
    from hetrun.runtime.ckpt import memory
    from hetrun.runtime.ckpt.memory_encode import Encoder
    from hetrun.runtime.context import RankContext

    torch.set_num_threads(1)

    def ctx(rank: int, component: str) -> RankContext:
        return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                           group=None, comm=None, device="cpu", seed=3, run_dir=Path("."), mode="inprocess")

    args = {"env_id": "CartPole-v1", "num_envs": 8, "num_steps": 128, "learning_rate": 0.0025}
    learner, roller = PPOWorkload(ctx(0, "learner"), **args), PPOWorkload(ctx(1, "rollout"), **args)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm, tempfile.TemporaryDirectory() as run:
        tier = memory.MemoryTier(run, shm, keep=4)
        encoders = {"learner": Encoder(), "rollout": Encoder()}
        phases: dict[str, dict[str, list[float]]] = {
            name: {"capture": [], "encode": [], "write": [], "cpu": []} for name in encoders}
        for i in range(rounds):
            batch = roller.rollout(learner.version)
            learner.backward(learner.forward(batch, 0, 1))
            learner.optimize()
            roller.load_policy(learner.policy_state(), learner.version)
            for owner, (name, wl) in enumerate((("learner", learner), ("rollout", roller))):
                c0, t0 = time.thread_time(), time.perf_counter()
                tree = recovery.snapshot_tree(wl, i, {"x": 1})
                t1 = time.perf_counter()
                blob = encoders[name].encode(i, owner, tree)
                t2 = time.perf_counter()
                tier.write(owner, i, blob)
                t3, c3 = time.perf_counter(), time.thread_time()
                if i >= WARMUP:
                    for k, v in (("capture", t1 - t0), ("encode", t2 - t1), ("write", t3 - t2), ("cpu", c3 - c0)):
                        phases[name][k].append(v)
                out.setdefault(name, {})["bytes"] = len(blob)
        for name, ph in phases.items():
            out[name]["ms"] = {k: round(1e3 * statistics.median(v), 3) for k, v in ph.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--json", type=Path, help="write the result here")
    a = p.parse_args()
    if a.rounds <= WARMUP:
        p.error(f"--rounds must exceed the {WARMUP} warm-up rounds")
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_before": os.getloadavg(),
           "rounds": a.rounds, **measure(a.rounds)}
    res["load_after"] = os.getloadavg()
    for name in ("learner", "rollout"):
        print(f"{name}: {res[name]['bytes']} B, ms per snapshot {res[name]['ms']}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

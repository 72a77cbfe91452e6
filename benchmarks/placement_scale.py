"""Placement matching on a synthetic 64-node pool, and Slurm's own start estimate beside it.

The pool is Slurm 22.05 ``sinfo --json`` (one real node record from
tests/data/pool/sinfo.json, copied 64 times): 24 nodes with 4 x a100, 24 with
4 x v100, 16 CPU-only; partitions ``gpu`` (the GPU nodes), ``cpu`` (CPU-only),
``debug`` (all); half the a100 nodes busy, 40 jobs pending. One run times:

- parse: sinfo/squeue JSON -> PoolSnapshot (rows, per-node free, pending);
- match: ``placement.score`` for each of a 3-component job (GPU learner, GPU
  evaluator, CPU rollout workers);
- estimate (the peer, when a Slurm cluster answers): one real
  ``sbatch --test-only`` per candidate, as ``pool --fit`` runs them.

    python3 benchmarks/placement_scale.py [--reps 200] [--no-slurm]

Prints JSON: median / p95 / max milliseconds of each part.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

from hetrun.slurm_plugin import placement, pool

SAMPLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "pool" / "sinfo.json"
JOB = {  # per-node needs of the three components
    "learner": placement.Need(nodes=4, cpus_per_node=8, gpus_per_node=4, mem_mb_per_node=64_000),
    "evaluator": placement.Need(nodes=1, cpus_per_node=4, gpus_per_node=1, mem_mb_per_node=16_000),
    "rollout": placement.Need(nodes=8, cpus_per_node=16, gpus_per_node=0, mem_mb_per_node=32_000),
}


def synthetic_sinfo(n: int = 64) -> dict[str, Any]:
    base = json.loads(SAMPLE.read_text())
    proto = base["nodes"][0]
    nodes = []
    for i in range(n):
        node = copy.deepcopy(proto)
        kind = "a100" if i < n * 3 // 8 else ("v100" if i < n * 6 // 8 else None)
        busy = kind == "a100" and i % 2 == 0
        node.update(name=f"n{i + 1}", cpus=32, real_memory=256_000, state="allocated" if busy else "idle",
                    alloc_cpus=32 if busy else 0, alloc_memory=256_000 if busy else 0, state_flags=[],
                    reason="", gres=f"gpu:{kind}:4" if kind else "",
                    gres_used=f"gpu:{kind}:{4 if busy else 0}" if kind else "",
                    partitions=["gpu", "debug"] if kind else ["cpu", "debug"])
        nodes.append(node)
    return {**base, "nodes": nodes}


def synthetic_squeue(pending: int = 40) -> dict[str, Any]:
    return {"jobs": [{"job_state": "PENDING", "partition": "gpu" if i % 2 else "cpu",
                      "tres_req_str": "cpu=8,mem=64000M,node=1,billing=8,gres/gpu=2"} for i in range(pending)]}


def _stats(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {"median_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
            "max_ms": round(ms[-1], 3), "n": len(ms)}


def run(reps: int, use_slurm: bool) -> dict[str, Any]:
    sinfo, squeue = synthetic_sinfo(), synthetic_squeue()
    parse_ms, match_ms = [], []
    snap = None
    for _ in range(reps):
        t0 = time.perf_counter()
        pending, running = pool.pending_from_squeue(squeue)
        snap = pool.PoolSnapshot(time.time(), 6.0, pool.rows_from_sinfo(sinfo), pending, [],
                                 pool.troubled_nodes(sinfo, {}), running, pool.nodes_from_sinfo(sinfo))
        t1 = time.perf_counter()
        best = {name: placement.score(need, snap) for name, need in JOB.items()}
        t2 = time.perf_counter()
        parse_ms.append((t1 - t0) * 1e3)
        match_ms.append((t2 - t1) * 1e3)
    assert snap is not None and len(snap.nodes) == 64
    out: dict[str, Any] = {"nodes": len(snap.nodes), "parse": _stats(parse_ms), "match": _stats(match_ms),
                           "best": {k: f"{v[0].partition} {v[0].gres}" for k, v in best.items() if v}}
    if use_slurm:
        # Slurm judges against the live cluster, not the synthetic pool: the
        # candidates are those of a small component on the live pool.
        live = pool.collect(hours=1)
        need = placement.Need(1, 1, 0, 100)
        cands = placement.score(need, live)
        est_ms = []
        for _ in range(max(3, reps // 20)):
            t0 = time.perf_counter()
            placement.with_start_estimates(need, copy.deepcopy(cands), placement.slurm_test_only())
            est_ms.append((time.perf_counter() - t0) * 1e3)
        out["estimate"] = {**_stats(est_ms), "candidates": len(cands)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--no-slurm", action="store_true", help="skip the sbatch --test-only part")
    args = ap.parse_args()
    print(json.dumps(run(args.reps, not args.no_slurm), indent=1))


if __name__ == "__main__":
    main()

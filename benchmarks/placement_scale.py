"""Placement matching on a synthetic 64-node pool, and Slurm's own start estimate beside it.

The pool is Slurm 22.05 ``sinfo --json`` (one real node record from
tests/data/pool/sinfo.json, copied 64 times): 24 nodes with 4 x a100, 24 with
4 x v100, 16 CPU-only; partitions ``gpu`` (the GPU nodes), ``cpu`` (CPU-only),
``debug`` (all); half the a100 nodes busy, 40 jobs pending. One run times:

- parse: sinfo/squeue JSON -> PoolSnapshot (rows, per-node free, pending);
- needs: ``dag.needs.component_needs`` of a 3-component RL job spec (GPU
  learner with ``node_counts: [4, 8]`` and GPU evaluator with ``placement: auto``,
  fixed CPU rollout workers), from its actions' resource profiles (the spec is
  expanded each time);
- quota: the submitter's limits (sacctmgr assoc/qos text as Slurm 22.05 prints
  it) against 30 running jobs' TRES (``quota.limits_for``);
- match: ``placement_fit.fit_components`` without Slurm's estimate: the fixed
  rollout taken first, every node count of the learner scored (and ``excluded``)
  against the quotas, each component's choice taken before the next;
- explain: ``placement_fit.explain_lines``, the ``hetrun plan --explain`` text;
- estimate (the peer, when a Slurm cluster answers): one real
  ``sbatch --test-only`` per candidate, as ``pool --fit`` runs them, and
  ``quota.read_quotas`` (scontrol show config + three sacctmgr calls) live.

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

from hetrun.dag.needs import component_needs
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin import placement, placement_fit, pool, quota

SAMPLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "pool" / "sinfo.json"
JOB = {  # needs per node: learner 8 CPUs / 4 GPUs / 64000 MB, evaluator 4 / 1 / 16000, rollout 16 / 0 / 32000
    "name": "scale", "workload": "pkg.mod:Work",
    "components": {
        "learner": {"nodes": 4, "tasks_per_node": 4, "cpus_per_task": 2, "gpus_per_node": 4, "mem": "64000M",
                    "gpu_mem": "30G", "placement": "auto", "node_counts": [4, 8],
                    "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]},
        "evaluator": {"nodes": 1, "cpus_per_task": 4, "gpus_per_node": 1, "mem": "16000M", "placement": "auto",
                      "actions": ["eval"]},
        "rollout": {"nodes": 8, "tasks_per_node": 16, "mem": "32000M", "actions": ["rollout"]},
    },
    "training": {"kind": "rl", "iterations": 10, "eval_interval": 5},
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


def synthetic_squeue(pending: int = 40, running: int = 30) -> dict[str, Any]:
    jobs = [{"job_state": "PENDING", "partition": "gpu" if i % 2 else "cpu",
             "tres_req_str": "cpu=8,mem=64000M,node=1,billing=8,gres/gpu=2"} for i in range(pending)]
    return {"jobs": jobs + [{"job_state": "RUNNING", "partition": "gpu", "account": "vision" if i % 3 else "nlp",
                             "user_name": "alice" if i % 2 else "bob", "qos": "pool_normal",
                             "tres_alloc_str": "cpu=8,mem=64000M,node=1,billing=8,gres/gpu=1,gres/gpu:a100=1"}
                            for i in range(running)]}


# sacctmgr -n -P show assoc / qos in hetrun's policy formats, as Slurm 22.05 prints them
# (tests/test_policy_plan.py's samples, with room for this job).
ASSOC = """\
root|||1|||normal||
vision|||10|cpu=2048,gres/gpu=96,mem=8000G||pool_high,pool_normal|pool_normal|root
vision|alice||1|gres/gpu=64||pool_high,pool_normal|pool_normal|
nlp|||10|gres/gpu=32||pool_normal|pool_normal|root
"""
QOS = """\
normal|0||cluster||||
pool_high|2000|pool_normal|requeue||||DenyOnLimit
pool_normal|1000||requeue||gres/gpu=160|gres/gpu=80|DenyOnLimit
"""


def _stats(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {"median_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
            "max_ms": round(ms[-1], 3), "n": len(ms)}


def run(reps: int, use_slurm: bool) -> dict[str, Any]:
    sinfo, squeue, spec = synthetic_sinfo(), synthetic_squeue(), spec_from_dict(JOB)
    times: dict[str, list[float]] = {k: [] for k in ("parse", "needs", "quota", "match", "explain", "total")}
    snap, fits, lines = None, {}, []
    for _ in range(reps):
        t0 = time.perf_counter()
        pending, running = pool.pending_from_squeue(squeue)
        snap = pool.PoolSnapshot(time.time(), 6.0, pool.rows_from_sinfo(sinfo), pending, [],
                                 pool.troubled_nodes(sinfo, {}), running, pool.nodes_from_sinfo(sinfo),
                                 pool.running_from_squeue(squeue))
        t1 = time.perf_counter()
        needs = component_needs(spec)
        t2 = time.perf_counter()
        limits, qos = quota.limits_for(ASSOC, QOS, snap.running_use, "alice", "vision", None)
        quotas = quota.Quotas("alice", "vision", qos, limits)
        t3 = time.perf_counter()
        fits = placement_fit.fit_components(needs, snap, None, ["learner", "evaluator"], quotas)
        t4 = time.perf_counter()
        lines = placement_fit.explain_lines(placement_fit.FitReport(fits, snap.taken_at, quotas=quotas))
        t5 = time.perf_counter()
        for key, a, b in (("parse", t0, t1), ("needs", t1, t2), ("quota", t2, t3), ("match", t3, t4),
                          ("explain", t4, t5), ("total", t0, t5)):
            times[key].append((b - a) * 1e3)
    assert snap is not None and len(snap.nodes) == 64
    out: dict[str, Any] = {"nodes": len(snap.nodes), **{k: _stats(v) for k, v in times.items()},
                           "best": {k: f"{f.best.label}" for k, f in fits.items() if f.best},
                           "candidates": {k: len(f.candidates) for k, f in fits.items()},
                           "explain_lines": len(lines)}
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
        # The shared cluster does not enforce limits: read_quotas stops after scontrol show config.
        # The enforcing path's calls (assoc_mgr, sacctmgr assoc + qos at once) are timed against the
        # same slurmctld / slurmdbd with the config answer saying limits are enforced.
        def enforcing(argv: Any) -> str:
            text = placement_fit._default_runner(argv)
            return text + "\nAccountingStorageEnforce = limits\n" if list(argv[:3]) == ["scontrol", "show",
                                                                                         "config"] else text
        for key, runner in (("quota_read_not_enforced", placement_fit._default_runner),
                            ("quota_read_enforcing_calls", enforcing)):
            read_ms = []
            for _ in range(max(3, reps // 20)):
                t0 = time.perf_counter()
                quota.read_quotas(runner, live.running_use)
                read_ms.append((time.perf_counter() - t0) * 1e3)
            out[key] = _stats(read_ms)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--no-slurm", action="store_true", help="skip the sbatch --test-only part")
    args = ap.parse_args()
    print(json.dumps(run(args.reps, not args.no_slurm), indent=1))


if __name__ == "__main__":
    main()

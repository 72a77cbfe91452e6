"""What one placement costs a submitter that places job after job (issue 21: the trace
replay's policy side submitted up to 29.6 s late at 0.6 s per placement on a loaded host).

Alternating, ``--reps`` times each on the same cluster at the same moment: (before) a full
``pool.collect`` (sinfo, squeue, sacct, sshare) per placement, as the replay did; (after) a
``pool.Collector`` that reads sinfo + squeue per placement and reuses sacct + sshare for
``--history-s``; each followed by ``placement.score`` + ``ranked_list`` for a 2-node GPU job
that accepts either type and may preempt. Prints per-call medians and each mode's p50/p95.

    python3 benchmarks/pool_snapshot_cost.py [--slurm-conf /var/lib/hetrun-hrpool/etc/slurm.conf] [--reps 20]

With ``--slurm-conf`` unset: the cluster SLURM_CONF (or Slurm's default) names. Writes JSON
to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from hetrun.slurm_plugin import placement, pool
from hetrun.slurm_plugin.backends.sbatch import SACCT_TIME_ENV
from hetrun.slurm_plugin.placement_fit import ranked_list

NEED = placement.Need(nodes=2, cpus_per_node=4, gpus_per_node=2, mem_mb_per_node=320, gpu_types=("a100", "v100"),
                      preempts=("hrpool_normal", "hrpool_normal_ckpt"), stops_clean=("hrpool_normal_ckpt",))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slurm-conf", type=Path)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--history-s", type=float, default=30.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    env = {**os.environ, **SACCT_TIME_ENV}
    if args.slurm_conf:
        env["SLURM_CONF"] = str(args.slurm_conf)
    calls: dict[str, list[float]] = {}

    def run(argv: Sequence[str]) -> str:
        t = time.monotonic()
        out = subprocess.run(list(argv), capture_output=True, text=True, env=env, check=False).stdout
        calls.setdefault(argv[0], []).append(1000 * (time.monotonic() - t))
        return out

    reuse = pool.Collector(run, hours=0.05, history_s=args.history_s)
    reuse.snapshot()  # the first one reads the history too, as in a replay's first placement
    took: dict[str, list[float]] = {"before_full_collect": [], "after_collector": []}
    score_ms: list[float] = []
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    for _ in range(args.reps):
        for mode, snap_of in (("before_full_collect", lambda: pool.collect(run, hours=0.05)),
                              ("after_collector", reuse.snapshot)):
            t = time.monotonic()
            snap = snap_of()
            t1 = time.monotonic()
            cands = placement.score(NEED, snap)
            if cands:
                ranked_list(cands, gpus=True)
            took[mode].append(1000 * (time.monotonic() - t))
            score_ms.append(1000 * (time.monotonic() - t1))
    doc = {"slurm_conf": str(args.slurm_conf or env.get("SLURM_CONF", "default")), "reps": args.reps,
           "history_s": args.history_s, "loadavg_start": load0,
           "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
           "per_call_ms_p50": {k: pct(v, 0.5) for k, v in calls.items()},
           "score_and_rank_ms_p50": pct(score_ms, 0.5),
           **{f"{k}_ms": {"p50": pct(v, 0.5), "p95": pct(v, 0.95), "mean": round(statistics.fmean(v), 1)}
              for k, v in took.items()}}
    print(json.dumps(doc, indent=1))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""What exact resume costs per iteration, on both examples (issue 10; target <= 2%).

The previous behaviour (consumers load the newest weights; only the component
with the ``checkpoint`` action saves; no pipeline state) cannot be switched on
any more, so this measures, side by side in one run and interleaved round by
round, each example job (``hetrun submit -b local --wait``, real mpirun ranks):

- ``exact``: checkpoint every ``--interval`` iterations, as the runtime does
  now: every component saves at every boundary, the learner's leader saves
  the policy versions in flight;
- ``none``: the same job with ``checkpoint.interval=0`` (no checkpoint at all).

Their throughput difference bounds from above what checkpointing costs,
exactness included. The parts exactness adds are also reported from the
``exact`` runs' own events and checkpoints: the stall of the saves the
previous behaviour did not make (rollout ranks, evaluator), the bytes of the
saved pipeline versions next to the learner's whole state, and the cost of
the exact-version rule's bookkeeping (StateHistory add/pick/prune) per
iteration.

    python benchmarks/exact_resume_bench.py                 # 3 rounds, ~8 minutes
    python benchmarks/exact_resume_bench.py --rounds 1 --iterations 20   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetrun import rundir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"ppo": "ppo_cartpole.yaml", "moe": "moe_lm.yaml"}


def run_job(example: str, runs: Path, iterations: int, interval: int) -> Path:
    cmd = [sys.executable, "-m", "hetrun.cli", "submit", str(ROOT / "examples" / EXAMPLES[example]),
           "-b", "local", "--runs-dir", str(runs), "--wait", "--wait-timeout", "900",
           "--set", f"training.iterations={iterations}", "--set", f"checkpoint.interval={interval}",
           "--set", f"training.eval_interval={iterations}"]
    before = set(runs.iterdir()) if runs.exists() else set()
    proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=960)
    if proc.returncode != 0:
        raise SystemExit(f"{example} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (run_dir,) = set(runs.iterdir()) - before
    return run_dir


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return list(rundir.read_events(run_dir))


def steady_rate(evs: list[dict[str, Any]]) -> float:
    """Learner updates per second between the ends of its updates, first tenth skipped."""
    ends = sorted(e["end"] for e in evs if e.get("ev") == "action" and e.get("component") == "learner"
                  and e.get("rank") == min(x["rank"] for x in evs if x.get("component") == "learner")
                  and "optimize" in e["id"].split("+"))
    ends = ends[max(1, len(ends) // 10):]
    return (len(ends) - 1) / (ends[-1] - ends[0])


def checkpoint_parts(run_dir: Path, evs: list[dict[str, Any]]) -> dict[str, Any]:
    """Stalls of the saves the previous behaviour did not make; pipeline bytes."""
    from hetrun.runtime.ckpt import open_store

    saves = [e for e in evs if e.get("ev") == "checkpoint" and e.get("reason") == "interval"]
    new = [e for e in saves if e["component"] != "learner"]
    learner = [e for e in saves if e["component"] == "learner"]
    store = open_store(run_dir / "ckpt" / "learner")
    step = store.steps()[0]
    state = store.load_rank(step, 0)[0]

    def nbytes(tree: Any) -> int:
        if hasattr(tree, "numel"):
            return int(tree.numel() * tree.element_size())
        if isinstance(tree, dict):
            return sum(nbytes(v) for v in tree.values())
        if isinstance(tree, (list, tuple)):
            return sum(nbytes(v) for v in tree)
        return 0

    return {
        "boundaries": len({e["iteration"] for e in saves}),
        "new_saves": len(new),
        "new_save_stall_s_mean": statistics.mean([e["info"]["stall_s"] for e in new]) if new else 0.0,
        "learner_save_stall_s_mean": statistics.mean([e["info"]["stall_s"] for e in learner]),
        "pipeline_bytes": nbytes(state.get("pipeline", {})),
        "learner_state_bytes": nbytes(state["workload"]),
    }


def history_cost_us(versions: int = 3) -> float:
    """Microseconds of StateHistory bookkeeping per iteration (add + pick + prune)."""
    from hetrun.runtime.state_history import StateHistory, pick_for

    h = StateHistory()
    n = 20000
    t0 = time.perf_counter()
    for it in range(n):
        h.add(it, None)
        pick_for(h, it - versions + 1)
        h.prune(it - versions + 1)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "exact_resume.json")
    args = ap.parse_args()
    results: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}, "started": time.time(),
                               "load_before": os.getloadavg(), "examples": {}}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        for example in EXAMPLES:
            rows: dict[str, list[float]] = {"exact": [], "none": []}
            parts = []
            for r in range(args.rounds):
                order = ("exact", "none") if r % 2 == 0 else ("none", "exact")
                for variant in order:
                    runs = Path(tmp) / f"{example}-{variant}-{r}"
                    run_dir = run_job(example, runs, args.iterations, args.interval if variant == "exact" else 0)
                    evs = read_events(run_dir)
                    rows[variant].append(steady_rate(evs))
                    if variant == "exact":
                        parts.append(checkpoint_parts(run_dir, evs))
                    print(f"{example} round {r} {variant}: {rows[variant][-1]:.3f} updates/s", flush=True)
            exact, none = statistics.median(rows["exact"]), statistics.median(rows["none"])
            it_s = 1.0 / exact
            part = parts[-1]
            # A rollout/evaluator rank stalls for its own save once per boundary.
            extra_per_it = part["new_save_stall_s_mean"] / args.interval
            results["examples"][example] = {
                "updates_per_s": rows, "median_exact": exact, "median_none": none,
                "cost_of_all_checkpointing": 1 - exact / none,
                "parts": parts, "iteration_s": it_s,
                "new_saves_stall_per_iteration_share": extra_per_it / it_s,
                "pipeline_share_of_learner_state": part["pipeline_bytes"] / part["learner_state_bytes"],
                "history_us_per_iteration": history_cost_us(),
            }
            print(json.dumps(results["examples"][example], indent=1, default=str), flush=True)
    results["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

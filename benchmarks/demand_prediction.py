"""Demand prediction error on held-out runs: last value vs EWMA vs LSTM (and the chooser).

Records short real runs through the local backend (mpirun, one process per
rank) of the two RL examples (PPO CartPole, PPO Atari) and the MoE LM, three
seeds each, alternating pipelined/coarse modes for PPO so the series differ in
shape. Per workload: seed runs 0 train the LSTM (one model for all series),
seed 1 runs choose per (metric, action type) whether the LSTM beats EWMA,
seed 2 runs are held out. Every predictor predicts each iteration's value from
the values before it (one step ahead, first 3 iterations as warm-up) on the
held-out runs; MAE (in the metric's unit) and relative error (MAE over the
mean |actual|) per workload and metric.

    python benchmarks/demand_prediction.py                   # records, then evaluates
    python benchmarks/demand_prediction.py --runs-from DIR   # evaluate runs recorded before
    ... --save model.json                                    # the chooser for `hetrun tune --model`

Heavy (it submits jobs): run it under the shared lock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hetrun.reports.demand.lstm import LSTMPredictor, save_chooser
from hetrun.reports.demand.predictors import (
    EWMA,
    Chooser,
    ErrorStats,
    LastValue,
    Predictor,
    evaluate,
)
from hetrun.reports.demand.series import METRICS, DemandSeries, read_demand

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# workload -> (job file, overrides for every run); kept short: tens of seconds a run here.
WORKLOADS: dict[str, tuple[str, list[str]]] = {
    "cartpole": ("ppo_cartpole.yaml", ["training.iterations=40", "training.eval_interval=10",
                                       "checkpoint.interval=20"]),
    "atari": ("ppo_atari.yaml", ["training.iterations=16", "training.eval_interval=8",
                                 "checkpoint.interval=8",
                                 "workload_args={env_id: ALE/Frostbite-v5, num_envs: 4, num_steps: 64, "
                                 "impala_width: 4, hidden: 64, update_epochs: 2, eval_episodes: 2, "
                                 "eval_max_steps: 300}"]),
    "moe_lm": ("moe_lm.yaml", ["training.iterations=30", "training.eval_interval=10",
                               "checkpoint.interval=15"]),
}
ROLES = ("train", "choose", "held_out")


def record(workload: str, seed: int, runs: Path, timeout: float) -> Path:
    from hetrun.dag.overrides import Overrides
    from hetrun.slurm_plugin.submit import backend_for, submit_file, wait_for_end
    from local_job import cancelled_on_failure

    job, sets = WORKLOADS[workload]
    sets = [*sets, f"training.seed={seed}"]
    if workload != "moe_lm":
        sets.append(f"training.mode={'pipelined' if seed % 2 == 0 else 'coarse'}")
    res = submit_file(EXAMPLES / job, Overrides(sets=sets), backend="local", runs_dir=runs / workload)
    backend = backend_for(res.run)
    with cancelled_on_failure(backend, res.run):
        status = wait_for_end(res.run, backend, timeout_s=timeout, poll_s=0.5)
    if any(c.state != "COMPLETED" for c in status.components):
        raise SystemExit(f"{workload} seed {seed} failed: {status.components} ({res.run.run_dir})")
    return Path(res.run.run_dir)


def series_of(run_dirs: list[Path]) -> list[DemandSeries]:
    out: list[DemandSeries] = []
    for run in run_dirs:
        out += [s for s in read_demand(run).series.values() if len(s.values) > 3]
    return out


def evaluate_all(predictors: list[Predictor], held_out: list[DemandSeries]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for metric in METRICS:
        members = [s for s in held_out if s.metric == metric]
        row: dict[str, Any] = {"series": len(members)}
        for p in predictors:
            stats: ErrorStats = evaluate(p, members)
            row[p.name] = {"mae": stats.mae, "relative": stats.relative, "n": stats.n}
        table[metric] = row
    return table


def fmt(metric: str, value: float) -> str:
    if value != value:  # nan
        return "-"
    if metric == "busy_s":
        return f"{value * 1e3:.2f} ms"
    return f"{value / 2**10:.1f} KiB" if metric == "bytes" else f"{value / 2**20:.1f} MiB"


def report(results: dict[str, dict[str, dict[str, Any]]], chooser: Chooser, meta: dict[str, Any]) -> str:
    lines = [f"recorded {meta['recorded_at']}, load average before: {meta['load_before']}, "
             f"after: {meta['load_after']}; LSTM final train loss {meta['train_loss']:.4f}", ""]
    lines.append("| workload | metric | series | last value MAE (rel) | EWMA MAE (rel) | LSTM MAE (rel) "
                 "| chosen MAE (rel) |")
    lines.append("|---|---|---|---|---|---|---|")
    for workload, table in results.items():
        for metric, row in table.items():
            cells = [f"{fmt(metric, row[n]['mae'])} ({row[n]['relative']:.1%})"
                     for n in ("last", "ewma", "lstm", "chosen")]
            lines.append(f"| {workload} | {metric} | {row['series']} | " + " | ".join(cells) + " |")
    used = sorted(f"{m}/{t}" for (m, t), u in chooser.use_lstm.items() if u)
    lines += ["", f"LSTM chosen for: {', '.join(used) or 'nothing'} (EWMA elsewhere)"]
    return "\n".join(lines)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    from local_job import cancel_on_sigterm

    cancel_on_sigterm()  # a kill cancels the running job too
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/hetrun-demand-bench"))
    ap.add_argument("--runs-from", type=Path, default=None,
                    help="evaluate runs recorded before (<dir>/<workload>/<run>/), record nothing")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first..first+2 train, choose, hold out (PPO mode: pipelined on even seeds)")
    ap.add_argument("--save", type=Path, default=None, help="write the trained chooser (JSON) here")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    meta: dict[str, Any] = {"recorded_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            "load_before": load_average(),
                            "seeds": dict(zip(ROLES, range(args.first_seed, args.first_seed + 3), strict=True))}
    runs: dict[str, dict[str, Path]] = {}
    for workload in args.workloads:
        if args.runs_from is not None:
            found = sorted(p for p in (args.runs_from / workload).iterdir() if (p / "events.jsonl").exists())
            runs[workload] = dict(zip(ROLES, found, strict=False))
        else:
            runs[workload] = {}
            for seed, role in enumerate(ROLES, start=args.first_seed):
                print(f"recording {workload} seed {seed} ({role})", file=sys.stderr, flush=True)
                runs[workload][role] = record(workload, seed, args.workdir, args.run_timeout)
    meta["load_after"] = load_average()

    lstm = LSTMPredictor(seed=0)
    meta["train_loss"] = lstm.fit(series_of([r["train"] for r in runs.values()]), steps=600)
    chooser = Chooser(EWMA(), lstm)
    chooser.choose(series_of([r["choose"] for r in runs.values() if "choose" in r]))
    predictors: list[Predictor] = [LastValue(), EWMA(), lstm, chooser]
    results = {w: evaluate_all(predictors, series_of([r["held_out"]])) for w, r in runs.items() if "held_out" in r}
    print(report(results, chooser, meta))
    if args.save:
        save_chooser(chooser, args.save)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results,
                                         "runs": {w: {k: str(v) for k, v in r.items()} for w, r in runs.items()},
                                         "use_lstm": sorted([m, t] for (m, t), u in chooser.use_lstm.items() if u)},
                                        indent=1))


if __name__ == "__main__":
    main()

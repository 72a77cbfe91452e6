"""Cost per million env steps and to a fixed return: hand-sized vs pipelined vs resized by ``hetrun tune``.

Three runs of the same PPO job (CartPole-v1, benchmarks/ppo_pipeline.py's
hyper-parameters: 8 envs x 128 steps per rollout rank and update), side by
side on the same cores through the local backend:

(1) naive: hand-sized like examples/ppo_cartpole.yaml (1 learner rank, 2
    rollout ranks, 1 cpu each) and run as the synchronous loop
    (``training.mode: coarse``);
(2) the same sizes, pipelined (rollouts up to one policy version stale);
(3) (2) resized: ``hetrun tune``'s proposal for run (2)
    (hetrun.reports.demand.sizing.propose, ``--max-cores`` = this machine's
    cores) applied to the spec with its own ``--set`` overrides, pipelined.

Cost = allocated core-hours x the report's price table
(hetrun.reports.cost.DEFAULT_PRICES, core_hour 0.05 USD, unless
``--prices``): per million env steps from the steady window of a throughput
run (cores x seconds per update / env steps per update), and to the fixed
return from a run that evaluates every ``--eval-interval`` updates (cores x
seconds from the first action to the end of the first evaluation whose mean
return reaches 475). Each job's cores are what it asked for (ranks x
cpus_per_task), as Slurm would charge them, even where the ranks outnumber
this machine's cores.

    python benchmarks/cost_tuning.py                  # ~5 minutes on 2 cores
    python benchmarks/cost_tuning.py --speed-updates 20 --ttt-updates 20   # smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_pipeline import job_dict, run_job

SEED_CLAIM = "71.2% cost cut; 3.2 -> 11.7 actions/s"


def naive_job(mode: str, seed: int, updates: int, eval_interval: int) -> dict[str, Any]:
    """The hand-sized job: examples/ppo_cartpole.yaml's 1 learner + 2 rollout ranks."""
    job = job_dict(mode, seed, updates, eval_interval, window=1)
    job["components"]["rollout"]["nodes"] = 2
    job["name"] = f"cost-{mode}-s{seed}"
    return job


def apply_overrides(job: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``components.C.key=value`` overrides (tune's ``--set`` list) applied to a job dict."""
    out = copy.deepcopy(job)
    for item in overrides:
        key, value = item.split("=", 1)
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = int(value) if value.isdigit() else value
    return out


def cores_of(job: dict[str, Any]) -> dict[str, int]:
    return {name: int(c["nodes"]) * int(c.get("tasks_per_node", 1)) * int(c["cpus_per_task"])
            for name, c in job["components"].items()}


def with_updates(job: dict[str, Any], updates: int, eval_interval: int, tag: str) -> dict[str, Any]:
    out = copy.deepcopy(job)
    out["training"]["iterations"] = updates
    out["training"]["eval_interval"] = eval_interval
    out["name"] = f"{job['name']}-{tag}"
    return out


def measure(label: str, job: dict[str, Any], args: argparse.Namespace, workdir: Path,
            core_hour: float) -> dict[str, Any]:
    """Throughput run and time-to-return run of ``job``; the cost figures of both."""
    cores = cores_of(job)
    total = sum(cores.values())
    speed = run_job(with_updates(job, args.speed_updates, 0, "speed"), cores, args.run_timeout, workdir)
    ttt = run_job(with_updates(job, args.ttt_updates, args.eval_interval, "ttt"), cores,
                  args.run_timeout, workdir)
    steps_per_update = speed["env_steps"] / (args.speed_updates)
    per_m = total * core_hour * speed["steady_s_per_update"] / 3600 / steps_per_update * 1e6
    to_return = None if ttt["solved_at_s"] is None else total * core_hour * ttt["solved_at_s"] / 3600
    row = {"label": label, "cores": cores, "total_cores": total, "mode": job["training"]["mode"],
           "steady_steps_per_s": speed["steady_steps_per_s"], "actions_per_s": speed["actions_per_s"],
           "busy": speed["busy"], "cost_per_m_steps": per_m, "solved_at_s": ttt["solved_at_s"],
           "solved_version": ttt["solved_version"], "cost_to_return": to_return,
           "run_dirs": [speed["run_dir"], ttt["run_dir"]]}
    print(f"{label}: {row['steady_steps_per_s']:,.0f} steps/s, {row['actions_per_s']:.1f} actions/s, "
          f"{per_m:.4f} per M steps, solved at {ttt['solved_at_s']}", flush=True)
    return row


def tuned_job(pipelined_run: str, base: dict[str, Any], prices: dict[str, Any],
              max_cores: int) -> tuple[dict[str, Any], Any]:
    from hetrun.reports.demand.sizing import propose

    proposal = propose(pipelined_run, prices, max_cores=max_cores)
    job = apply_overrides(base, proposal.overrides())
    job["name"] = base["name"].replace("pipelined", "tuned")
    return job, proposal


def report(rows: list[dict[str, Any]], proposal: Any, args: argparse.Namespace, currency: str) -> str:
    naive = rows[0]
    lines = [f"| job | cores (learner+rollout) | steady env steps/s | actions/s | {currency} per M env steps "
             f"| cut vs naive | time to 475 (s) | {currency} to 475 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cut = 1 - r["cost_per_m_steps"] / naive["cost_per_m_steps"]
        ret = "not reached" if r["solved_at_s"] is None else f"{r['solved_at_s']:.1f}"
        cost_ret = "-" if r["cost_to_return"] is None else f"{r['cost_to_return']:.6f}"
        lines.append(f"| {r['label']} | {r['cores']['learner']}+{r['cores']['rollout']} | "
                     f"{r['steady_steps_per_s']:,.0f} | {r['actions_per_s']:.1f} | "
                     f"{r['cost_per_m_steps']:.4f} | {cut:+.1%} | {ret} | {cost_ret} |")
    tuned = rows[-1]
    lines += ["", f"naive -> tuned: cost per M env steps cut {1 - tuned['cost_per_m_steps'] / naive['cost_per_m_steps']:.1%}, "
              f"actions/s {naive['actions_per_s']:.1f} -> {tuned['actions_per_s']:.1f} "
              f"(the seed's claim: {SEED_CLAIM})"]
    if naive["cost_to_return"] and tuned["cost_to_return"]:
        lines.append(f"naive -> tuned: cost to 475 cut {1 - tuned['cost_to_return'] / naive['cost_to_return']:.1%}")
    lines.append(f"tune's own prediction for (2) -> (3): {proposal.cost_cut:.1%} cheaper per step, "
                 f"{proposal.current_steps_per_s:,.0f} -> {proposal.proposed_steps_per_s:,.0f} steps/s "
                 f"(overrides: {' '.join(proposal.overrides())})")
    lines.append(f"load average before: {args.load_before}, after: {os.getloadavg()[0]:.2f} "
                 f"on {os.cpu_count()} cores")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speed-updates", type=int, default=100, help="updates of the throughput runs")
    ap.add_argument("--ttt-updates", type=int, default=60, help="most updates of the time-to-475 runs")
    ap.add_argument("--eval-interval", type=int, default=5)
    ap.add_argument("--max-cores", type=int, default=os.cpu_count() or 2,
                    help="cores tune's proposal may use (default: this machine's)")
    ap.add_argument("--prices", type=Path, default=None, help="price table YAML (as `hetrun report`)")
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from hetrun.reports.cost import load_prices, prices_path

    prices = load_prices(prices_path(args.prices))
    core_hour = float(prices.get("core_hour", 0.0))
    args.load_before = f"{os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="cost-bench-") as tmp:
        workdir = Path(tmp)
        rows = [measure("(1) naive: hand-sized, synchronous loop", naive_job("coarse", args.seed, 0, 0),
                        args, workdir, core_hour)]
        pipelined = naive_job("pipelined", args.seed, 0, 0)
        rows.append(measure("(2) same sizes, pipelined", pipelined, args, workdir, core_hour))
        tuned, proposal = tuned_job(rows[-1]["run_dirs"][0], pipelined, prices, args.max_cores)
        rows.append(measure("(3) pipelined, resized by hetrun tune", tuned, args, workdir, core_hour))
        text = report(rows, proposal, args, str(prices.get("currency", "USD")))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "proposal": proposal.to_json()}, indent=1))
    print()
    print(text)


if __name__ == "__main__":
    main()

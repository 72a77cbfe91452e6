"""Cost per million env steps and to a fixed return: what users run today vs hetrun vs hetrun after `tune`.

Three jobs of the same PPO (CartPole-v1, 8 envs x 128 steps = 1,024 env steps
per update, 4 epochs x 4 minibatches, the 64x64 tanh actor-critic), the same
number of updates (equal work), evaluation every ``--eval-interval`` updates
(20 sampled-action episodes, examples/ppo.py's protocol), one after the other
on this machine:

(A) **by hand, one allocation**: stable-baselines3 PPO as its users run it
    (``make_vec_env`` + ``PPO("MlpPolicy")``), the learner and all envs in one
    allocation of all the machine's cores and the memory the same user gives
    hetrun's example (3 GiB); torch at one thread, SB3's best setting here
    (benchmarks/ppo.md: faster than two for this MLP on 2 cores; torch's
    default two threads ran 115 env steps/s on the loaded machine, cost_tuning.md);
(B) **hetrun, as first written**: examples/ppo_cartpole.yaml fitted to this
    machine's cores (learner 1 core 2G + rollout 1 rank x 1 core 1G),
    pipelined (the example's mode), same hyper-parameters;
(C) **(B) after `hetrun tune`**: ``propose()`` on run (B) with the price
    table below and (B)'s own cores as the budget, its ``--set`` overrides
    applied, run again.

Every job is charged exactly what it was allocated (cores x core_hour + GiB x
mem_gb_hour), never more cores than the machine has, for its allocation's
time: launch to exit (start-up included) for the whole-run figures, and per
the steady throughput (reports/throughput.py: median of windows after warm-up,
the same rule for all three) for the steady figures. Cost to the fixed
return: allocation from launch to the end of the first evaluation >= 475.
Tune's prediction for (C) (throughput and cost per M env steps, calibrated on
(B)'s measured steady rate) is set against (C)'s measurement.

Price table: AWS Fargate on-demand, Linux/x86, us-east-1 (per vCPU-hour and
per GB-hour, https://aws.amazon.com/fargate/pricing/), a public price that
charges cores and memory apart, as an allocation holds them. The GPU
projection uses AWS EC2 on-demand us-east-1 list prices (p3.2xlarge: 1 V100,
8 vCPU; c5.2xlarge: 8 vCPU); it is a projection from measured busy seconds,
labelled as such.

    flock /var/lock/hetrun-heavy.lock python benchmarks/cost_tuning.py --seeds 0 1 2 --json out.json
    flock /var/lock/hetrun-heavy.lock python benchmarks/cost_tuning.py --example moe --seeds 0 1 2 --updates 300
    flock /var/lock/hetrun-heavy.lock python benchmarks/cost_tuning.py --example atari --seeds 0 1 2 --updates 12
    python benchmarks/cost_tuning.py --updates 12 --seeds 0      # smoke

``--example atari`` / ``--example moe`` check tune's prediction on the Atari PPO
(examples/ppo_atari.yaml) and the MoE LM (examples/moe_lm.yaml): (B) and (C)
only, each example fitted to this machine's cores the same way (an evaluator-only
component folded into the first one, then the component with the most ranks cut
a node at a time), its own hyper-parameters and evaluation schedule. No (A):
these are tune's model checked against the run it predicts, not a peer
comparison (benchmarks/atari.md has SB3 and CleanRL on Atari).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
EXAMPLES = {"cartpole": HERE.parent / "examples" / "ppo_cartpole.yaml",
            "atari": HERE.parent / "examples" / "ppo_atari.yaml",
            "moe": HERE.parent / "examples" / "moe_lm.yaml"}
SEED_CLAIM = "71.2% cost cut; 3.2 -> 11.7 actions/s"
ENV_ID = "CartPole-v1"
HYPER: dict[str, Any] = {
    "num_envs": 8, "num_steps": 128, "learning_rate": 2.5e-3, "gamma": 0.99, "gae_lambda": 0.95,
    "clip_coef": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5,
    "update_epochs": 4, "num_minibatches": 4, "hidden": 64, "eval_episodes": 20,
}
PRICES: dict[str, Any] = {  # AWS Fargate, Linux/x86, us-east-1, on-demand
    "currency": "USD", "core_hour": 0.04048, "mem_gb_hour": 0.004445, "gpu_hour": 0.0, "node_hour": 0.0,
    "partitions": {},
}
GPU_PRICES = {"p3.2xlarge (1 V100, 8 vCPU)": 3.06, "c5.2xlarge (8 vCPU)": 0.34}  # USD/h, EC2 us-east-1
BASELINE_MEM_GB = 3.0  # (A): what the same user gives hetrun's example (2G learner + 1G rollout)


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


def alloc_price(cores: float, mem_gb: float) -> float:
    """USD per hour of an allocation of ``cores`` and ``mem_gb``."""
    return cores * PRICES["core_hour"] + mem_gb * PRICES["mem_gb_hour"]


# ------------------------------------------------------------------ (A) stable-baselines3


def sb3_worker(seed: int, updates: int, eval_interval: int) -> dict[str, Any]:
    """Runs in its own process (the allocation); prints one JSON line."""
    import numpy as np
    import torch
    from hetrun.examples.ppo_envs import make_vector_env
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)  # the baseline's best setting (module docstring)
    h, batch = HYPER, HYPER["num_envs"] * HYPER["num_steps"]
    model = PPO("MlpPolicy", make_vec_env(ENV_ID, n_envs=h["num_envs"], seed=seed),
                n_steps=h["num_steps"], batch_size=batch // h["num_minibatches"], n_epochs=h["update_epochs"],
                learning_rate=h["learning_rate"], gamma=h["gamma"], gae_lambda=h["gae_lambda"],
                clip_range=h["clip_coef"], ent_coef=h["ent_coef"], vf_coef=h["vf_coef"],
                max_grad_norm=h["max_grad_norm"],
                policy_kwargs={"net_arch": {"pi": [h["hidden"]] * 2, "vf": [h["hidden"]] * 2},
                               "activation_fn": torch.nn.Tanh}, seed=seed, device="cpu", verbose=0)

    def evaluate(version: int) -> float:
        n = h["eval_episodes"]
        eval_seed = int(np.random.SeedSequence([seed, 1, version]).generate_state(1)[0])
        envs, obs = make_vector_env(ENV_ID, n, eval_seed % (2**31 - n))
        returns, running = np.zeros(n), np.ones(n, dtype=bool)
        with torch.no_grad():
            while running.any():
                dist = model.policy.get_distribution(torch.as_tensor(obs, dtype=torch.float32))
                obs, r, term, trunc, _ = envs.step(dist.sample().numpy())
                returns += r * running
                running &= ~np.logical_or(term, trunc)
        envs.close()
        return float(returns.mean())

    ends: list[float] = []
    out: dict[str, Any] = {"solved_wall": None, "eval_returns": []}

    class Clock(BaseCallback):
        def _eval(self, version: int) -> None:
            ret = evaluate(version)
            out["eval_returns"].append(round(ret, 1))
            if ret >= 475 and out["solved_wall"] is None:
                out["solved_wall"] = time.time()

        def _on_rollout_start(self) -> None:
            version = self.model.num_timesteps // batch
            if version:
                ends.append(time.time())  # update version-1 ended
                if eval_interval and version % eval_interval == 0:
                    self._eval(version)

        def _on_training_end(self) -> None:
            ends.append(time.time())

        def _on_step(self) -> bool:
            return True

    model.learn(total_timesteps=updates * batch, callback=Clock())
    out.update(env_steps=int(model.num_timesteps), ends=ends, batch=batch)
    return out


def run_sb3(seed: int, updates: int, eval_interval: int, timeout: float) -> dict[str, Any]:
    from hetrun.reports.throughput import steady_rate

    launched = time.time()
    proc = subprocess.run([sys.executable, __file__, "--sb3-worker", str(seed), str(updates), str(eval_interval)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    exited = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"SB3 run failed:\n{proc.stderr[-3000:]}")
    w = json.loads(proc.stdout.strip().splitlines()[-1])
    steady, spread = steady_rate([(t, w["batch"]) for t in w["ends"]])
    return {"env_steps": w["env_steps"], "alloc_s": exited - launched, "steady": steady, "spread": spread,
            "solved_s": None if w["solved_wall"] is None else w["solved_wall"] - launched,
            "eval_returns": w["eval_returns"], "busy": None, "run_dir": None}


# ------------------------------------------------------------------ (B), (C) hetrun


def fit_to_cores(job: dict[str, Any], cores: int) -> None:
    """Shrink ``job`` in place until it asks for at most ``cores`` (:func:`allocation`): a component that only
    evaluates is folded into the first (its eval runs there), then the component with the most
    ranks loses a node at a time (CartPole, Atari: a rollout rank; the MoE LM: a learner node)."""
    comps = job["components"]
    first = next(iter(comps))
    while allocation(job)[0] > cores:
        evaluator = next((n for n, c in comps.items() if n != first and c.get("actions") == ["eval"]), None)
        if evaluator is not None:
            del comps[evaluator]
            comps[first]["actions"] = [*comps[first]["actions"], "eval"]
            continue
        shrinkable = [n for n, c in comps.items() if int(c["nodes"]) > 1]
        if not shrinkable:
            raise SystemExit(f"{job['name']} does not fit {cores} cores with one node per component")
        biggest = max(shrinkable, key=lambda n: int(comps[n]["nodes"]) * int(comps[n].get("tasks_per_node", 1)))
        comps[biggest]["nodes"] -= 1


def first_written(example: str, seed: int, updates: int, eval_interval: int | None, cores: int) -> dict[str, Any]:
    """The example's YAML fitted to ``cores`` (:func:`fit_to_cores`); CartPole with ``HYPER``."""
    job = yaml.safe_load(EXAMPLES[example].read_text())
    fit_to_cores(job, cores)
    job["name"] = f"cost-first-{example}-s{seed}"
    if example == "cartpole":
        job["workload_args"] = {**job["workload_args"], "env_id": ENV_ID, **HYPER}  # eval_spread as shipped
    job["training"].update(iterations=updates, seed=seed)
    if eval_interval is not None:
        job["training"]["eval_interval"] = eval_interval
    job["checkpoint"] = {"interval": 0}
    job.pop("slurm", None)
    return job


def apply_overrides(job: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``components.C.key=value`` overrides (tune's ``--set`` list) applied to a job dict."""
    out = copy.deepcopy(job)
    for item in overrides:
        key, value = item.split("=", 1)
        node = out
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = int(value) if value.isdigit() else value
    return out


def allocation(job: dict[str, Any]) -> tuple[int, float]:
    """(cores, GiB) the job asks for: ranks x cpus_per_task, nodes x mem (a YAML's mem is per node)."""
    from hetrun.slurm_plugin.policy.model import size_mb

    cores, mem_mb = 0, 0.0
    for c in job["components"].values():
        ranks = int(c["nodes"]) * int(c.get("tasks_per_node", 1))
        cores += ranks * int(c["cpus_per_task"])
        mem_mb += int(c["nodes"]) * size_mb(c["mem"])
    return cores, mem_mb / 1024


def run_hetrun(job: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    from hetrun.reports.throughput import run_throughput
    from hetrun.runtime.events import read_events
    from hetrun.slurm_plugin.submit import backend_for, submit_file, wait_for_end
    from local_job import cancelled_on_failure

    path = workdir / f"{job['name']}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    launched = time.time()
    res = submit_file(path, None, backend="local", runs_dir=workdir / "runs")
    backend = backend_for(res.run)
    with cancelled_on_failure(backend, res.run):
        status = wait_for_end(res.run, backend, timeout_s=timeout, poll_s=0.2)
    exited = time.time()
    run_dir = Path(res.run.run_dir)
    if any(c.state != "COMPLETED" for c in status.components):
        raise SystemExit(f"hetrun {job['name']} failed: {status.components} ({run_dir})")
    tp = run_throughput(run_dir)
    a = tp.attempts[-1]
    evals = sorted((e for e in read_events(run_dir) if e.get("ev") == "action" and e.get("type") == "eval"),
                   key=lambda e: e["end"])
    solved = next((e for e in evals if (e.get("metrics") or {}).get("solved")), None)
    return {"env_steps": a.work, "alloc_s": exited - launched, "steady": a.steady, "spread": a.spread,
            "solved_s": None if solved is None else solved["end"] - launched,
            "eval_returns": [round(e["metrics"]["eval_return_mean"], 1) for e in evals
                             if "eval_return_mean" in (e.get("metrics") or {})],
            "run_dir": str(run_dir)}


# ------------------------------------------------------------------ figures


def costs(row: dict[str, Any], cores: int, mem_gb: float) -> dict[str, Any]:
    price = alloc_price(cores, mem_gb)
    return {**row, "cores": cores, "mem_gb": mem_gb, "usd_per_hour": price,
            "core_h_per_m": cores * row["alloc_s"] / 3600 / row["env_steps"] * 1e6,
            "usd_per_m_whole": price * row["alloc_s"] / 3600 / row["env_steps"] * 1e6,
            "usd_per_m_steady": price / 3600 / row["steady"] * 1e6 if row["steady"] else None,
            "usd_to_475": None if row["solved_s"] is None else price * row["solved_s"] / 3600,
            "core_h_to_475": None if row["solved_s"] is None else cores * row["solved_s"] / 3600}


def gpu_projection(run_dir: str) -> dict[str, Any]:
    """PROJECTION, not a measurement: the seeds' setting priced from (B)'s measured busy seconds.

    One GPU-node job (p3.2xlarge) runs rollouts on its 8 vCPUs and the learner on its GPU in turn,
    holding the GPU throughout; the het job runs the learner on the GPU node and the rollouts on a
    CPU node (c5.2xlarge) side by side. Rollout seconds per update scale from this machine's
    measured rollout busy seconds by 1 core -> 8 vCPUs (perfect scaling, stated); the learner's GPU
    seconds per update are the measured CPU seconds over an assumed GPU speed-up ``s``."""
    from hetrun.reports.demand.series import read_demand

    d = read_demand(run_dir)
    its = max(1, len(d.steps_per_iteration))
    busy = {c: sum(sum(s.values) for (cc, _k, m), s in d.series.items() if cc == c and m == "busy_s") / its
            for c in ("rollout", "learner")}
    steps = statistics.median(d.steps_per_iteration.values())
    gpu_h, cpu_h = GPU_PRICES["p3.2xlarge (1 V100, 8 vCPU)"], GPU_PRICES["c5.2xlarge (8 vCPU)"]
    rows = []
    for s in (1.0, 5.0, 20.0):
        r, learn = busy["rollout"] / 8, busy["learner"] / s
        one = gpu_h * (r + learn) / 3600 / steps * 1e6  # holds the GPU node through rollouts
        het = (gpu_h + cpu_h) * max(r, learn) / 3600 / steps * 1e6
        rows.append({"gpu_speedup": s, "one_gpu_node_usd_per_m": one, "het_usd_per_m": het,
                     "cut": 1 - het / one})
    return {"rollout_busy_s_per_update": busy["rollout"], "learner_busy_s_per_update": busy["learner"],
            "steps_per_update": steps, "rows": rows}


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table(rows: list[dict[str, Any]], unit: str = "env steps") -> str:
    lines = [f"| seed | job | cores + GiB charged | steady {unit}/s (windows) | core-h per M | USD per M "
             "(whole run) | USD per M (steady) | cost vs (A) (steady) | core-h to 475 | USD to 475 | cost vs (A) to 475 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        # the cost against (A), where the run has one: negative is a cut, printed as one ("-25.0%")
        base = next((b for b in rows if b["seed"] == r["seed"] and b["job"].startswith("(A)")), r)
        cut = (None if base is r or not (r["usd_per_m_steady"] and base["usd_per_m_steady"])
               else r["usd_per_m_steady"] / base["usd_per_m_steady"] - 1)
        cut475 = (None if base is r or not (r["usd_to_475"] and base["usd_to_475"])
                  else r["usd_to_475"] / base["usd_to_475"] - 1)
        spread = f" ({r['spread'][0]:,.0f}–{r['spread'][1]:,.0f})" if r["spread"] else ""
        lines.append(f"| {r['seed']} | {r['job']} | {r['cores']} + {r['mem_gb']:.2f} | {fmt(r['steady'], ',.0f')}"
                     f"{spread} | {r['core_h_per_m']:.3f} | {r['usd_per_m_whole']:.4f} | "
                     f"{fmt(r['usd_per_m_steady'], '.4f')} | {fmt(cut, '+.1%')} | {fmt(r['core_h_to_475'], '.5f')} | "
                     f"{fmt(r['usd_to_475'], '.6f')} | "
                     f"{fmt(cut475, '+.1%')} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sb3-worker":
        print(json.dumps(sb3_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
        return
    from local_job import cancel_on_sigterm

    cancel_on_sigterm()  # a kill cancels the running job too
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", choices=sorted(EXAMPLES), default="cartpole",
                    help="cartpole: (A), (B), (C); atari, moe: tune's prediction only, (B) and (C)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--updates", type=int, default=240,
                    help="updates of every job (equal work); CartPole at 60 (~2.5 s steady) measures a job's "
                         "steady rate to +/-15 %% between two runs of it, at 240 to ~1 %% (cost_tuning.md)")
    ap.add_argument("--eval-interval", type=int, default=None,
                    help="evaluate every N updates (default: CartPole 5, the others their example's own)")
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from hetrun.reports.demand.sizing import propose

    cores = machine_cores()
    load_before = os.getloadavg()
    rows, proposals, projection = [], [], None
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="cost-bench-") as tmp:
        workdir = Path(tmp)
        eval_interval = 5 if args.eval_interval is None and args.example == "cartpole" else args.eval_interval
        for seed in args.seeds:
            if args.example == "cartpole":
                sb3 = run_sb3(seed, args.updates, eval_interval, args.run_timeout)
                rows.append({"seed": seed, "job": "(A) SB3, one allocation",
                             **costs(sb3, cores, BASELINE_MEM_GB)})
            first = first_written(args.example, seed, args.updates, eval_interval, cores)
            b = run_hetrun(first, workdir, args.run_timeout)
            rows.append({"seed": seed, "job": "(B) hetrun as first written", **costs(b, *allocation(first))})
            p = propose(b["run_dir"], PRICES)
            tuned = apply_overrides(first, p.overrides())
            tuned["name"] = f"cost-tuned-{args.example}-s{seed}"
            c = run_hetrun(tuned, workdir, args.run_timeout)
            rows.append({"seed": seed, "job": "(C) (B) after hetrun tune", **costs(c, *allocation(tuned))})
            proposals.append({"seed": seed, **p.to_json(), "measured_steady": c["steady"],
                              "measured_usd_per_m_steady": rows[-1]["usd_per_m_steady"],
                              "prediction_error_steps": (p.predicted_steps_per_s / c["steady"] - 1)
                              if c["steady"] else None,
                              "prediction_error_cost": (p.proposed_cost_per_m / rows[-1]["usd_per_m_steady"] - 1)
                              if rows[-1]["usd_per_m_steady"] else None})
            if projection is None and args.example == "cartpole":
                projection = gpu_projection(b["run_dir"])
            for r in rows[-3 if args.example == "cartpole" else -2:]:
                print(f"seed {seed} {r['job']}: steady {fmt(r['steady'], ',.0f')} {p.unit}/s, "
                      f"{fmt(r['usd_per_m_steady'], '.4f')} USD/M steady, {r['usd_per_m_whole']:.4f} USD/M whole, "
                      f"to 475 {fmt(r['usd_to_475'], '.6f')}", flush=True)
    doc = {"rows": rows, "proposals": proposals, "gpu_projection": projection, "prices": PRICES,
           "gpu_prices": GPU_PRICES, "cores": cores, "load_before": load_before, "load_after": os.getloadavg(),
           "updates": args.updates, "seeds": args.seeds, "example": args.example, "seed_claim": SEED_CLAIM}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    print()
    print(table(rows, proposals[0]["unit"] if proposals else "env steps"))
    for p in proposals:
        print(f"seed {p['seed']}: tune {p['decision']} {p['reason']} overrides {' '.join(p['overrides'])}; predicted "
              f"{p['predicted_steps_per_s']:,.0f} {p['unit']}/s, {p['proposed_cost_per_m']:.4f} USD/M "
              f"({p['cost_change']:+.1%} cost); measured {fmt(p['measured_steady'], ',.0f')}, "
              f"{fmt(p['measured_usd_per_m_steady'], '.4f')}: error {fmt(p['prediction_error_steps'], '+.1%')} "
              f"(steps/s), {fmt(p['prediction_error_cost'], '+.1%')} (cost)")
    print(f"load average before {load_before}, after {os.getloadavg()} on {cores} cores")


if __name__ == "__main__":
    main()

"""The headline: one PPO job three ways on the same 2 cores, side by side in one run.

(a) hetrun, pipelined: a learner rank and a rollout rank (one core each) as two
    het components of one job, run by the real runtime (local backend: one
    ``mpirun`` MPMD launch); the rollout keeps collecting with weights up to
    ``--window`` versions old while the learner trains.
(b) coarse: exactly the same job, components and cores, ``training.mode:
    coarse`` - the synchronous loop: rollout waits for the newest weights, the
    learner waits for the rollout.
(c) peer: stable-baselines3 PPO with the same hyper-parameters (8 envs x 128
    steps, 4 epochs x 4 minibatches of 256, lr 2.5e-3, gamma 0.99, lambda 0.95,
    clip 0.2, vf 0.5, ent 0, grad norm 0.5, 64x64 tanh actor and critic, Adam
    eps 1e-5) in one process with the same two cores available.

Each run does ``--iterations`` updates of 1024 env steps and evaluates every
``--eval-interval`` updates with the same protocol (20 episodes, sampled
actions, env seeds from (seed, 1, policy version)); time-to-threshold is the
end of the first evaluation whose mean return reaches gymnasium's
``reward_threshold`` (475), measured from the first training action (hetrun) or
from ``learn()`` (SB3); the launch-inclusive time is reported too. Env steps/s,
actions/s and busy fractions come from the run's events.jsonl.

Throughput is reported twice: steady state (updates after the first tenth,
which carry one-time start-up such as the learner's first torch._dynamo
import) and start-up seconds apart, plus the whole-run figure. Next to the
(a)/(b) ratio stands its bound (R+L)/max(R,L) from the runs' own busy seconds
per update; ``--steady-check`` repeats the throughput phase at twice the
updates and prints how far the ratio moves (a steady figure moves < 5%).

    python benchmarks/ppo_pipeline.py                      # 3 seeds, ~10 minutes
    python benchmarks/ppo_pipeline.py --steady-check --phases speed   # is 200 updates steady?
    python benchmarks/ppo_pipeline.py --seeds 0 --speed-iterations 20 --iterations 20   # smoke run
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

import yaml

ENV_ID = "CartPole-v1"
HYPER: dict[str, Any] = {  # shared by (a), (b) and (c)
    "num_envs": 8, "num_steps": 128, "learning_rate": 2.5e-3, "gamma": 0.99, "gae_lambda": 0.95,
    "clip_coef": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5,
    "update_epochs": 4, "num_minibatches": 4, "hidden": 64, "eval_episodes": 20,
}


# ------------------------------------------------------------------ hetrun (a) and (b)


def job_dict(mode: str, seed: int, iterations: int, eval_interval: int, window: int) -> dict[str, Any]:
    return {
        "name": f"ppo-bench-{mode}-s{seed}",
        "workload": "hetrun.examples.ppo:PPOWorkload",
        "workload_args": {"env_id": ENV_ID, **HYPER},
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "2G",
                        "actions": ["forward", "backward", "sync", "optimize", "eval"]},
            "rollout": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                        "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": iterations, "micro_batches": 2,
                     "pipeline_window": max(window, 1), "seed": seed,
                     "eval_interval": eval_interval, "mode": mode},
        "actions": {"rollout": {"tolerance_window": window}},
        "checkpoint": {"interval": 0},
        "env": {"OMP_NUM_THREADS": "1"},
    }


def job_yaml(mode: str, seed: int, iterations: int, eval_interval: int, window: int) -> str:
    return yaml.safe_dump(job_dict(mode, seed, iterations, eval_interval, window), sort_keys=False)


def run_job(job: dict[str, Any], cores: dict[str, int], run_timeout: float, workdir: Path) -> dict[str, Any]:
    """Submit ``job`` (a job YAML as a dict) to the local backend, wait, summarise its events.

    ``cores``: cores per component (ranks x cpus_per_task), for the busy fractions.
    """
    from hetrun.dag.errors import HetrunError
    from hetrun.runtime.events import read_events
    from hetrun.slurm_plugin.submit import backend_for, submit_file, wait_for_end

    path = workdir / f"{job['name']}-e{job['training']['eval_interval']}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    launched = time.time()
    res = submit_file(path, None, backend="local", runs_dir=workdir / "runs")
    backend = backend_for(res.run)
    try:
        status = wait_for_end(res.run, backend, timeout_s=run_timeout, poll_s=0.2)
    except HetrunError:
        backend.cancel(res.run)  # never leave a benchmark job running
        raise
    finished = time.time()
    run_dir = Path(res.run.run_dir)
    events = list(read_events(run_dir))
    errors = [e for e in events if e.get("ev") == "error"]
    if errors or any(c.state != "COMPLETED" for c in status.components):
        raise SystemExit(f"hetrun {job['name']} run failed ({run_dir}): "
                         f"{errors[0]['error'] if errors else status.components}")
    out = summarize_events(events, cores=cores)
    out.update(run_dir=str(run_dir), launch_to_exit_s=finished - launched)
    if out["solved_at_s"] is not None:
        out["solved_from_launch_s"] = out["solved_wall"] - launched
    return out


def run_hetrun(mode: str, seed: int, iterations: int, eval_interval: int,
               args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    job = job_dict(mode, seed, iterations, eval_interval, args.window)
    out = run_job(job, {"learner": 1, "rollout": 1}, args.run_timeout, workdir)
    out.update(mode=mode, seed=seed)
    return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_s(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Seconds during which both interval sets are active."""
    xs, ys = _merged(xs), _merged(ys)
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def warmup_updates(iterations: int) -> int:
    """Updates left out of the steady-state figures: one-time start-up (the
    learner's first optimizer step imports torch._dynamo, ~2 s of CPU; first
    weight messages; allocator warm-up) lands in the first few."""
    return max(2, iterations // 10)


def bound(r_s: float, l_s: float) -> float | None:
    """(R+L)/max(R,L): the most a perfect two-core pipeline of a rollout taking R
    and a learner taking L per update can gain over running them in turn."""
    return (r_s + l_s) / max(r_s, l_s) if max(r_s, l_s) > 0 else None


def steady_state(ends: dict[int, float], t0: float, steps_per_update: int, warm: int) -> dict[str, Any]:
    """Steady throughput from the wall time at which each update ended.

    ``ends[i]`` is the end of update i (the learner's last action of iteration
    i; SB3: the start of the next rollout). Steady = updates warm..N-1 over
    the time between the end of update warm-1 and the end of the last one;
    start-up cost = the time before that beyond what warm updates take at the
    steady rate (what a longer run amortises, reported apart).
    """
    n = max(ends) + 1
    span = ends[n - 1] - ends[warm - 1]
    per_update = span / (n - warm)
    return {"steady_steps_per_s": (n - warm) * steps_per_update / span,
            "steady_s_per_update": per_update,
            "startup_s": max(0.0, (ends[warm - 1] - t0) - warm * per_update),
            "warmup_updates": warm}


def summarize_events(events: list[dict[str, Any]], cores: dict[str, int]) -> dict[str, Any]:
    actions = [e for e in events if e.get("ev") == "action" and not e.get("skipped")]
    t0 = min(e["start"] for e in actions)
    t1 = max(e["end"] for e in actions)
    span = t1 - t0
    steps = sum(int(e.get("steps", 0)) for e in actions if e["type"] == "rollout")
    busy = {
        comp: sum(e["end"] - e["start"] for e in actions if e["component"] == comp) / (span * n)
        for comp, n in cores.items()
    }
    # How much of the rollout's working time the learner was working too: the pipelining itself.
    spans = {c: [(e["start"], e["end"]) for e in actions if e["component"] == c] for c in cores}
    rollout_time = sum(b - a for a, b in _merged(spans["rollout"]))
    overlap = overlap_s(spans["rollout"], spans["learner"]) / rollout_time if rollout_time else 0.0
    evals = sorted((e for e in actions if e["type"] == "eval"), key=lambda e: e["end"])
    solved = next((e for e in evals if e.get("metrics", {}).get("solved")), None)
    # optimize is usually fused with the gradient sync ("sync.grads+optimize"): go by its metrics.
    staleness = [e["metrics"]["staleness"] for e in actions if "staleness" in e.get("metrics", {})]
    learner = [e for e in actions if e["component"] == "learner"]
    ends: dict[int, float] = {}
    for e in learner:
        ends[e["iteration"]] = max(ends.get(e["iteration"], 0.0), e["end"])
    n = max(ends) + 1
    warm = warmup_updates(n)
    steady = steady_state(ends, t0, steps // n, warm)
    # Busy seconds per update of each side inside the steady window: R and L of the bound.
    per = {c: sum(e["end"] - e["start"] for e in actions
                  if e["component"] == c and e["iteration"] >= warm) / (n - warm) for c in cores}
    return {
        "env_steps": steps,
        "span_s": span,
        "steps_per_s": steps / span,
        **steady,
        "rollout_busy_s": per["rollout"],
        "learner_busy_s": per["learner"],
        "bound": bound(per["rollout"], per["learner"]),
        "actions": len(actions),
        "actions_per_s": len(actions) / span,
        "busy": busy,
        "overlap": overlap,
        "mean_staleness": statistics.fmean(staleness) if staleness else None,
        "solved_at_s": None if solved is None else solved["end"] - t0,
        "solved_wall": None if solved is None else solved["end"],
        "solved_version": None if solved is None else solved["metrics"].get("policy_version"),
        "eval_returns": [round(e["metrics"]["eval_return_mean"], 1) for e in evals],
    }


# ------------------------------------------------------------------ stable-baselines3 (c)


def run_sb3(seed: int, iterations: int, eval_interval: int, args: argparse.Namespace) -> dict[str, Any]:
    launched = time.time()
    cmd = [sys.executable, __file__, "--sb3-worker", "--seeds", str(seed),
           "--iterations", str(iterations), "--eval-interval", str(eval_interval)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"SB3 run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(mode="sb3", seed=seed, launch_to_exit_s=time.time() - launched)
    if out["solved_at_s"] is not None:
        out["solved_from_launch_s"] = out["solved_wall"] - launched
    return out


def sb3_worker(seed: int, iterations: int, eval_interval: int) -> dict[str, Any]:
    """Runs in its own process; prints one JSON line. Same eval protocol as PPOWorkload."""
    import numpy as np
    import torch
    from hetrun.examples.ppo_envs import env_facts, make_vector_env
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    # One thread: measured faster than two for this MLP size (two threads contend on 2 cores).
    torch.set_num_threads(1)
    threshold = env_facts(ENV_ID)[2]
    h = HYPER
    batch = h["num_envs"] * h["num_steps"]
    model = PPO(
        "MlpPolicy", make_vec_env(ENV_ID, n_envs=h["num_envs"], seed=seed),
        n_steps=h["num_steps"], batch_size=batch // h["num_minibatches"], n_epochs=h["update_epochs"],
        learning_rate=h["learning_rate"], gamma=h["gamma"], gae_lambda=h["gae_lambda"],
        clip_range=h["clip_coef"], ent_coef=h["ent_coef"], vf_coef=h["vf_coef"],
        max_grad_norm=h["max_grad_norm"], normalize_advantage=True,
        policy_kwargs={"net_arch": {"pi": [h["hidden"]] * 2, "vf": [h["hidden"]] * 2},
                       "activation_fn": torch.nn.Tanh},
        seed=seed, device="cpu", verbose=0,
    )

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

    log: dict[str, Any] = {"eval_returns": [], "solved_at_s": None, "solved_wall": None,
                           "solved_version": None}

    class EvalEvery(BaseCallback):
        def _evaluate_now(self, version: int) -> None:
            ret = evaluate(version)
            log["eval_returns"].append(round(ret, 1))
            if ret >= threshold and log["solved_at_s"] is None:
                log["solved_wall"] = time.time()
                log["solved_at_s"] = log["solved_wall"] - started
                log["solved_version"] = version

        def _on_rollout_start(self) -> None:
            version = self.model.num_timesteps // batch  # updates done so far
            if version:
                ends[version - 1] = time.time()  # update version-1 ended: the steady-state clock
            if eval_interval and version and version % eval_interval == 0:
                self._evaluate_now(version)

        def _on_training_end(self) -> None:
            ends[iterations - 1] = time.time()
            if eval_interval:  # after the last update, as hetrun evaluates its last iteration
                self._evaluate_now(iterations)

        def _on_step(self) -> bool:
            return True

    ends: dict[int, float] = {}
    started = time.time()
    cpu0 = time.process_time()
    model.learn(total_timesteps=iterations * batch, callback=EvalEvery())
    span = time.time() - started
    steps = int(model.num_timesteps)
    # One loop, no actions to count; busy = CPU time of the process over the 2 cores' time.
    log.update(env_steps=steps, span_s=span, steps_per_s=steps / span, actions=None,
               actions_per_s=None, busy={"process": (time.process_time() - cpu0) / (2 * span)},
               mean_staleness=0.0,
               **steady_state(ends, started, batch, warmup_updates(iterations)))
    return log


# ------------------------------------------------------------------ machine load


_SPIN = """
import subprocess, sys, time
code = "import time\\nt = time.perf_counter()\\nwhile time.perf_counter() - t < %f: pass\\nprint(time.process_time())"
procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
         for _ in range(2)]
print(sum(float(p.communicate()[0]) for p in procs))
"""


def cores_available(seconds: float = 1.5) -> float:
    """CPU-seconds per second two busy processes of one new session get right now.

    hetrun's local job runs in its own session; with the kernel's autogroup
    scheduling, sessions (not processes) share the CPUs fairly, so this is how
    many cores a job could use at the moment: 2.0 on an idle 2-core machine,
    and the ceiling of any pipelining speed-up when other sessions are busy.
    """
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _SPIN % seconds], capture_output=True, text=True,
                         start_new_session=True, check=True)
    wall = time.perf_counter() - t0
    # The interpreters' start-up is part of both the CPU time and the wall time.
    return float(out.stdout.strip()) / max(wall, 1e-9)


# ------------------------------------------------------------------ report


def median_or_none(values: list[float | None]) -> float | None:
    """Median counting a run that never reached the threshold as infinitely slow."""
    if not values:
        return None
    med = statistics.median([float("inf") if v is None else v for v in values])
    return None if med == float("inf") else med


NAMES = {"pipelined": "(a) hetrun pipelined", "coarse": "(b) hetrun coarse (synchronous loop)",
         "sb3": "(c) stable-baselines3 PPO"}


def _by_mode(results: list[dict[str, Any]], phase: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["phase"] == phase:
            out.setdefault(r["mode"], []).append(r)
    return out


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _speed_table(speed: dict[str, list[dict[str, Any]]], iterations: int) -> list[str]:
    warm = warmup_updates(iterations)
    lines = [f"Throughput: {iterations} updates x 1024 env steps, no evaluation; steady state = "
             f"updates {warm}..{iterations - 1} (the first {warm} carry the one-time start-up).", "",
             "| run | steady env steps/s | start-up (s) | whole-run env steps/s | actions/s | "
             "busy: learner core / rollout core | R / L busy s per update | "
             "rollout time overlapped by learner work |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in ("pipelined", "coarse", "sb3"):
        runs = speed.get(mode)
        if not runs:
            continue
        if mode == "sb3":
            aps, rl = "n/a (one loop)", "n/a"
            busy = f"one process: {statistics.median(r['busy']['process'] for r in runs):.0%} of 2 cores"
            overlap = "0% (one loop)"
        else:
            overlap = f"{statistics.median(r['overlap'] for r in runs):.0%}"
            aps = f"{_med(runs, 'actions_per_s'):,.1f}"
            busy = " / ".join(f"{statistics.median(r['busy'][c] for r in runs):.0%}"
                              for c in ("learner", "rollout"))
            rl = f"{_med(runs, 'rollout_busy_s'):.4f} / {_med(runs, 'learner_busy_s'):.4f}"
        lines.append(f"| {NAMES[mode]} | {_med(runs, 'steady_steps_per_s'):,.0f} | "
                     f"{_med(runs, 'startup_s'):.2f} | {_med(runs, 'steps_per_s'):,.0f} | {aps} | "
                     f"{busy} | {rl} | {overlap} |")
    return lines


def pipelining_ratio(speed: dict[str, list[dict[str, Any]]]) -> tuple[float, float, float] | None:
    """(a)/(b) steady env steps/s, and the bound (R+L)/max(R,L) from the coarse
    and from the pipelined runs' own busy seconds (medians over seeds)."""
    if "pipelined" not in speed or "coarse" not in speed:
        return None
    ratio = _med(speed["pipelined"], "steady_steps_per_s") / _med(speed["coarse"], "steady_steps_per_s")
    return ratio, _med(speed["coarse"], "bound"), _med(speed["pipelined"], "bound")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"Median of seeds {args.seeds}.", ""]
    speed = _by_mode(results, "speed")
    lines += _speed_table(speed, args.speed_iterations)
    got = pipelining_ratio(speed)
    if got:
        ratio, b_coarse, b_pipe = got
        pipe = speed["pipelined"]
        # How close (a) is to its own limit: a perfect pipeline takes max(R, L) per update.
        eff = statistics.median(max(r["rollout_busy_s"], r["learner_busy_s"]) / r["steady_s_per_update"]
                                for r in pipe)
        lines += ["", f"(a) / (b) steady env steps/s: **{ratio:.2f}x** (target >= 1.7x); bound "
                      f"(R+L)/max(R,L) from the runs' own busy seconds: pipelined {b_pipe:.2f}x, "
                      f"coarse {b_coarse:.2f}x; (a) takes max(R,L) / (s per update) = {eff:.0%} "
                      f"of its own limit (100% = the busier side never waits)"]
        whole = _med(speed["pipelined"], "steps_per_s") / _med(speed["coarse"], "steps_per_s")
        lines.append(f"(a) / (b) whole-run env steps/s, start-up included: {whole:.2f}x")
    double = _by_mode(results, "speed2x")
    got2 = pipelining_ratio(double)
    if got and got2:
        change = got2[0] / got[0] - 1
        lines += ["", *_speed_table(double, 2 * args.speed_iterations), "",
                  f"steadiness: (a)/(b) at {2 * args.speed_iterations} updates {got2[0]:.2f}x vs "
                  f"{got[0]:.2f}x at {args.speed_iterations}: {change:+.1%} (must stay within 5%)"]
    stale = [r["mean_staleness"] for r in speed.get("pipelined", []) if r["mean_staleness"] is not None]
    if stale:
        lines.append(f"(a) mean staleness of the learned batches: {statistics.fmean(stale):.2f} "
                     f"policy versions (window {args.window})")

    lines += ["", f"Time to CartPole-v1's reward_threshold (475, mean of 20 sampled-action "
              f"evaluation episodes every {args.eval_interval} updates, at most "
              f"{args.iterations} updates); median of seeds {args.seeds}.", "",
              "| run | time to 475 (s) | from launch (s) | per seed (s) | updates to 475 per seed |",
              "|---|---|---|---|---|"]
    ttt = _by_mode(results, "ttt")
    for mode in ("pipelined", "coarse", "sb3"):
        runs = ttt.get(mode)
        if not runs:
            continue
        med = median_or_none([r["solved_at_s"] for r in runs])
        launch = median_or_none([r.get("solved_from_launch_s") for r in runs])
        per = ", ".join("not reached" if r["solved_at_s"] is None else f"{r['solved_at_s']:.1f}"
                        for r in runs)
        vers = ", ".join("-" if r["solved_version"] is None else str(int(r["solved_version"]))
                         for r in runs)
        lines.append(f"| {NAMES[mode]} | {'not reached' if med is None else f'**{med:.1f}**'} | "
                     f"{'-' if launch is None else f'{launch:.1f}'} | {per} | {vers} |")
    a = median_or_none([r["solved_at_s"] for r in ttt.get("pipelined", [])])
    c = median_or_none([r["solved_at_s"] for r in ttt.get("sb3", [])])
    if a is not None and c is not None:
        lines += ["", f"(c) / (a) time to threshold: **{c / a:.2f}x** (target > 1)"]
    probes = [r["cores_available"] for r in results if r.get("cores_available") is not None]
    lines += ["", f"load average (1 min) before: {args.load_before}, after: "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; cores a job could get "
              f"(2 busy processes in one session, probed before each seed's runs): "
              + ", ".join(f"{p:.2f}" for p in probes)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--speed-iterations", type=int, default=200,
                    help="updates of the throughput runs (no evaluation); long enough to be steady")
    ap.add_argument("--steady-check", action="store_true",
                    help="also run the throughput phase at twice --speed-iterations and print how "
                         "much the (a)/(b) ratio moves (phase speed2x)")
    ap.add_argument("--iterations", type=int, default=60,
                    help="updates of the time-to-threshold runs")
    ap.add_argument("--eval-interval", type=int, default=5)
    ap.add_argument("--window", type=int, default=1, help="tolerance window of the rollout (a)")
    ap.add_argument("--modes", nargs="+", default=["pipelined", "coarse", "sb3"],
                    choices=["pipelined", "coarse", "sb3"])
    ap.add_argument("--phases", nargs="+", default=["speed", "ttt"],
                    choices=["speed", "speed2x", "ttt"])
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep job files and run directories here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write all results here")
    ap.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sb3_worker:
        print(json.dumps(sb3_worker(args.seeds[0], args.iterations, args.eval_interval)))
        return
    if args.steady_check and "speed2x" not in args.phases:
        args.phases.insert(args.phases.index("speed") + 1 if "speed" in args.phases else 0, "speed2x")
    args.load_before = f"{os.getloadavg()[0]:.2f}"
    results = []
    with tempfile.TemporaryDirectory(prefix="ppo-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            probe = cores_available()
            print(f"seed {seed}: a job could get {probe:.2f} cores now", flush=True)
            for phase in args.phases:
                iterations, every = {"speed": (args.speed_iterations, 0),
                                     "speed2x": (2 * args.speed_iterations, 0),
                                     "ttt": (args.iterations, args.eval_interval)}[phase]
                # Interleave the three ways per seed so machine load hits them alike.
                for mode in args.modes:
                    r = (run_sb3(seed, iterations, every, args) if mode == "sb3"
                         else run_hetrun(mode, seed, iterations, every, args, workdir))
                    r.pop("solved_wall", None)
                    r["phase"] = phase
                    r["cores_available"] = probe if (phase, mode) == (args.phases[0], args.modes[0]) else None
                    results.append(r)
                    solved = f" (steady {r['steady_steps_per_s']:,.0f})" if phase != "ttt" else (
                        f", solved at {r['solved_at_s']:.1f} s" if r["solved_at_s"] is not None
                        else ", not solved")
                    print(f"seed {seed} {phase:7s} {mode:9s}: {r['steps_per_s']:8,.0f} steps/s"
                          f"{solved}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print()
    print(report(results, args))


if __name__ == "__main__":
    main()

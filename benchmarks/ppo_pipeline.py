"""The headline: one PPO job three ways on the same 2 cores, side by side in one run.

(a) hetrun, pipelined: a learner rank and a rollout rank (one core each) as two
    het components of one job, run by the real runtime (local backend: one
    ``mpirun`` MPMD launch); the rollout keeps collecting with weights up to
    ``--window`` versions old while the learner trains.
(b) coarse: exactly the same job, components and cores, ``training.mode:
    coarse`` - the synchronous loop: rollout waits for the newest weights, the
    learner waits for the rollout.
(a') the same as (a) with the example's evaluation schedule (20 episodes every
    ``--eval-interval`` updates) during the throughput runs: what evaluation costs.
(c) peers at their best, with the same hyper-parameters (8 envs x 128 steps, 4
    epochs x 4 minibatches of 256, lr 2.5e-3, gamma 0.99, lambda 0.95, clip
    0.2, vf 0.5, ent 0, grad norm 0.5, 64x64 tanh actor and critic, Adam eps
    1e-5) and the same two cores: stable-baselines3 PPO (``sb3:<dummy|subproc>:
    <torch threads>``: DummyVecEnv or SubprocVecEnv, 1 or 2 threads) and a
    CleanRL-style single-file PPO (``cleanrl:<sync|async|envpool>:<threads>``,
    benchmarks/cleanrl_ppo.py). The report names the best peer configuration
    and holds (a) to it (target >= 1.25x, and no slower to 475).

Each run does ``--iterations`` updates of 1024 env steps and evaluates every
``--eval-interval`` updates with the same protocol (20 episodes, sampled
actions, env seeds from (seed, 1, policy version)); time-to-threshold is the
end of the first evaluation whose mean return reaches gymnasium's
``reward_threshold`` (475), measured from the first training action (hetrun) or
from ``learn()`` (SB3); the launch-inclusive time is reported too. Env steps/s,
actions/s and busy fractions come from the run's events.jsonl.

Throughput is reported as start-up seconds and steady state apart: steady =
the median, over windows of 20 updates after the first tenth (which carries
one-time start-up such as the learner's first torch._dynamo import), of each
window's seconds per update; start-up = what the first tenth took beyond the
steady rate. Next to each (a)/(b) ratio stands its bound (R+L)/max(R,L) from
the runs' own busy seconds per update. (a)/(b) is taken per seed from runs
made back to back, then the median over seeds. By default (a) and (b) also run
at twice the updates and the benchmark prints how far the ratio moves (a
steady figure moves < 5%; ``--no-steady-check`` skips it). Phase and mode
order alternate so a machine slowing down over the minutes hits every run
alike, and a machine probe before each run (fixed Python work in two
processes) shows how many cores a job could get and whether the machine's
own speed moved between runs.

    python benchmarks/ppo_pipeline.py --seeds 0 --speed-iterations 80 --iterations 60 --no-steady-check \
        --json s0.json   # one seed, every peer configuration, ~8 min; then --merge s0.json s1.json
    python benchmarks/ppo_pipeline.py                      # 3 seeds, every mode, long
    python benchmarks/ppo_pipeline.py --seeds 0 1 --phases speed --modes pipelined coarse  # headline, ~6 min
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


def job_dict(mode: str, seed: int, iterations: int, eval_interval: int, window: int,
             eval_on: str = "rollout", rollout_ranks: int = 1) -> dict[str, Any]:
    """``eval_on``: the component whose rank runs the evaluation (the rollout, as
    examples/ppo_cartpole.yaml ships: its first rank, on the weights its rollout already has;
    or the learner). ``rollout_ranks``: 1, or 2 as the example ships."""
    learner_actions = ["forward", "backward", "sync", "optimize"] + (["eval"] if eval_on == "learner" else [])
    rollout_actions = ["rollout"] + (["eval"] if eval_on == "rollout" else [])
    return {
        "name": f"ppo-bench-{mode}-s{seed}",
        "workload": "hetrun.examples.ppo:PPOWorkload",
        # eval_spread as examples/ppo_cartpole.yaml ships it: on the rollout rank, spread over the
        # rollouts between two evaluations (examples/ppo_spread_eval.py)
        "workload_args": {"env_id": ENV_ID, **HYPER, "eval_spread": eval_on == "rollout"},
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "2G",
                        "actions": learner_actions},
            "rollout": {"nodes": 1, "tasks_per_node": rollout_ranks, "cpus_per_task": 1, "mem": "1G",
                        "actions": rollout_actions},
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
    from hetrun.runtime.events import read_events
    from hetrun.slurm_plugin.submit import backend_for, submit_file, wait_for_end
    from local_job import cancelled_on_failure

    path = workdir / f"{job['name']}-e{job['training']['eval_interval']}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    launched = time.time()
    res = submit_file(path, None, backend="local", runs_dir=workdir / "runs")
    backend = backend_for(res.run)
    with cancelled_on_failure(backend, res.run):
        status = wait_for_end(res.run, backend, timeout_s=run_timeout, poll_s=0.2)
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
    job = job_dict("pipelined" if mode == "pipelined_eval" else mode, seed, iterations, eval_interval,
                   args.window, args.eval_on, args.rollout_ranks)
    out = run_job(job, {"learner": 1, "rollout": args.rollout_ranks}, args.run_timeout, workdir)
    out.update(mode=mode, seed=seed, eval_on=args.eval_on, rollout_ranks=args.rollout_ranks)
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


# Steady state is measured per window of this many updates (fewer in short runs): the
# same width at every run length, so a doubled run is judged by windows of the same size.
STEADY_WINDOW = 20


def steady_windows(n: int, warm: int) -> list[tuple[int, int]]:
    """Consecutive windows [a, b) of equal width over updates warm..n-1 (a partial last one
    is dropped): at most STEADY_WINDOW updates wide, at least five windows when the run allows."""
    width = max(1, min(STEADY_WINDOW, (n - warm) // 5))
    return [(a, a + width) for a in range(warm, n - width + 1, width)]


def steady_state(ends: dict[int, float], t0: float, steps_per_update: int, warm: int) -> dict[str, Any]:
    """Steady throughput from the wall time at which each update ended.

    ``ends[i]`` is the end of update i (the learner's last action of iteration
    i; SB3: the start of the next rollout). Steady = the median over the
    windows after warm-up of each window's seconds per update: a minute in
    which the shared machine slows down moves one window, not the figure.
    Start-up cost = the time before the end of update warm-1 beyond what warm
    updates take at the steady rate (what a longer run amortises, reported
    apart).
    """
    n = max(ends) + 1
    per = [(ends[b - 1] - ends[a - 1]) / (b - a) for a, b in steady_windows(n, warm)]
    if not per:  # a run stopped at its target within the warm-up (--stop-at-target): no steady rate
        return {"steady_steps_per_s": None, "steady_s_per_update": None, "startup_s": None,
                "warmup_updates": warm, "window_s_per_update": []}
    per_update = statistics.median(per)
    return {"steady_steps_per_s": steps_per_update / per_update,
            "steady_s_per_update": per_update,
            "startup_s": max(0.0, (ends[warm - 1] - t0) - warm * per_update),
            "warmup_updates": warm,
            "window_s_per_update": per}


def drift(per_window: list[float]) -> float | None:
    """Median s/update of the last third of the windows over the first third, minus one: how
    much one run slows (+) or speeds up (-) as it goes on."""
    k = len(per_window) // 3
    if k == 0:
        return None
    return statistics.median(per_window[-k:]) / statistics.median(per_window[:k]) - 1


def busy_per_update(actions: list[dict[str, Any]], component: str, wins: list[tuple[int, int]]) -> float:
    """Median over the steady windows of ``component``'s seconds inside actions per update."""
    by_it: dict[int, float] = {}
    for e in actions:
        if e["component"] == component:
            by_it[e["iteration"]] = by_it.get(e["iteration"], 0.0) + e["end"] - e["start"]
    return statistics.median(sum(by_it.get(i, 0.0) for i in range(a, b)) / (b - a) for a, b in wins)


def eval_cost_in_run(ends: dict[int, float], eval_iterations: set[int],
                     wins: list[tuple[int, int]]) -> float | None:
    """What evaluation added to this run's update period, measured inside it (immune to the
    machine's share moving between runs): the learner's periods of the update that evaluated
    (on the learner, evaluation ends its iteration) and of the two after it (a rollout rank's
    evaluation delays the next rollout, hence the next update; the one after absorbs the rest)
    against the median period of the other steady updates, as a share of the steady time.
    None without evaluations in the steady windows."""
    if not wins or not eval_iterations:
        return None
    steady = range(wins[0][0], wins[-1][1])
    period = {i: ends[i] - ends[i - 1] for i in steady if i - 1 in ends and i in ends}
    hit = {k + d for k in eval_iterations for d in (0, 1, 2)} & set(period)
    calm = [p for i, p in period.items() if i not in hit]
    if not hit or not calm:
        return None
    typical = statistics.median(calm)
    return sum(period[i] - typical for i in hit) / (typical * len(period))


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
    # Busy seconds per update of each side in the steady windows: R and L of the bound.
    wins = steady_windows(n, warm)
    per = {c: busy_per_update(actions, c, wins) for c in cores}
    # The same quantities window by window (R, L and the period of one window together): the
    # pipeline's own efficiency max(R,L)/period, free of the medians coming from different windows.
    train = [e for e in actions if e["type"] != "eval"]
    per_window = [{"s_per_update": (ends[b - 1] - ends[a - 1]) / (b - a),
                   **{c: busy_per_update(train, c, [(a, b)]) / cores[c] for c in cores}}
                  for a, b in wins]
    # Evaluation's cost inside this run (immune to the machine's share moving between runs): the
    # seconds per batched evaluation step (an evaluation runs as many steps as its longest
    # episode, eval_return_max for CartPole's reward of 1 per step), and the learner's seconds
    # per update without it.
    timed = [(e["end"] - e["start"], e["metrics"]["eval_return_max"]) for e in evals
             if e.get("metrics", {}).get("eval_return_max")]
    return {
        "eval_s_per_step": sum(s for s, _ in timed) / sum(k for _, k in timed) if timed else None,
        "learner_update_s": busy_per_update([e for e in actions if e["type"] != "eval"], "learner",
                                            steady_windows(n, warm)),
        "env_steps": steps,
        "span_s": span,
        "steps_per_s": steps / span,
        **steady,
        "per_window": per_window,
        "efficiency": statistics.median(max(w["rollout"], w["learner"]) / w["s_per_update"]
                                        for w in per_window),
        "eval_cost_in_run": eval_cost_in_run(ends, {e["iteration"] for e in evals}, wins),
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


def peer_config(mode: str) -> tuple[str, str, int]:
    """``sb3:dummy:1`` -> (peer, vector env, torch threads); plain ``sb3`` is ``sb3:dummy:1``."""
    parts = mode.split(":")
    if parts[0] == "sb3" and len(parts) == 1:
        return "sb3", "dummy", 1
    ok = {"sb3": ("dummy", "subproc"), "cleanrl": ("sync", "async", "envpool")}
    if len(parts) != 3 or parts[0] not in ok or parts[1] not in ok[parts[0]] or not parts[2].isdigit():
        raise SystemExit(f"--modes: {mode!r} is not a mode; peers are sb3:<dummy|subproc>:<threads> "
                         "or cleanrl:<sync|async|envpool>:<threads>")
    return parts[0], parts[1], int(parts[2])


# Every peer configuration worth trying on 2 cores (the "peers at their best").
PEER_MODES = ["sb3:dummy:1", "sb3:dummy:2", "sb3:subproc:1", "sb3:subproc:2",
              "cleanrl:sync:1", "cleanrl:async:1", "cleanrl:envpool:1", "cleanrl:envpool:2"]


def is_peer(mode: str) -> bool:
    return mode.split(":")[0] in ("sb3", "cleanrl")


def run_peer(mode: str, seed: int, iterations: int, eval_interval: int,
             args: argparse.Namespace) -> dict[str, Any]:
    peer, vec, threads = peer_config(mode)
    launched = time.time()
    if peer == "sb3":
        cmd = [sys.executable, __file__, "--sb3-worker", "--seeds", str(seed), "--iterations", str(iterations),
               "--eval-interval", str(eval_interval), "--sb3-vec", vec, "--sb3-threads", str(threads)]
    else:
        cmd = [sys.executable, str(Path(__file__).with_name("cleanrl_ppo.py")), "--family", "cartpole",
               "--vec", vec, "--threads", str(threads), "--updates", str(iterations), "--seed", str(seed),
               "--eval-interval", str(eval_interval), "--hyper", json.dumps(HYPER)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    except subprocess.TimeoutExpired:
        # A configuration this slow is no contender: recorded, left out of the tables.
        return {"mode": mode, "seed": seed, "failed": f"did not finish within {args.run_timeout:.0f} s"}
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(mode=mode, seed=seed, launch_to_exit_s=time.time() - launched)
    if out["solved_at_s"] is not None:
        out["solved_from_launch_s"] = out["solved_at_s"] + (out.get("started_wall", launched) - launched)
    return out


def sb3_worker(seed: int, iterations: int, eval_interval: int, vec: str = "dummy",
               threads: int = 1) -> dict[str, Any]:
    """Runs in its own process; prints one JSON line. Same eval protocol as PPOWorkload.

    ``vec``: SB3's DummyVecEnv (all envs in this process) or SubprocVecEnv (one process per
    env, SB3's advice when env steps are costly); ``threads``: torch intra-op threads.
    """
    import numpy as np
    import torch
    from hetrun.examples.ppo_envs import env_facts, first_episode_returns, make_eval_env
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    torch.set_num_threads(threads)
    threshold = env_facts(ENV_ID)[2]
    h = HYPER
    batch = h["num_envs"] * h["num_steps"]
    model = PPO(
        "MlpPolicy", make_vec_env(ENV_ID, n_envs=h["num_envs"], seed=seed,
                                  vec_env_cls=DummyVecEnv if vec == "dummy" else SubprocVecEnv),
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
        envs, obs = make_eval_env(ENV_ID, n, eval_seed % (2**31 - n))

        @torch.no_grad()
        def act(o: np.ndarray) -> np.ndarray:  # SB3's own sampling; the env steps as hetrun's do
            return model.policy.get_distribution(torch.as_tensor(o, dtype=torch.float32)).sample().numpy()

        try:
            return float(first_episode_returns(envs, obs, act).mean())
        finally:
            envs.close()

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
    model.get_env().close()
    steps = int(model.num_timesteps)
    # One loop, no actions to count; busy = CPU time of the process over the 2 cores' time.
    log.update(started_wall=started, env_steps=steps, span_s=span, steps_per_s=steps / span, actions=None,
               actions_per_s=None, busy={"process": (time.process_time() - cpu0) / (2 * span)},
               mean_staleness=0.0,
               **steady_state(ends, started, batch, warmup_updates(iterations)))
    return log


# ------------------------------------------------------------------ machine load


_CHUNKS = """
import time
def chunk():
    x = 0
    for j in range(20000):
        x += j * j
t, n = time.perf_counter(), 0
while time.perf_counter() - t < %f:
    chunk()
    n += 1
print(time.process_time(), n)
"""
_SPIN = """
import subprocess, sys
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
         for _ in range(2)]
outs = [p.communicate()[0].split() for p in procs]
print(sum(float(o[0]) for o in outs), sum(int(o[1]) for o in outs))
"""


def machine_probe(seconds: float = 1.5) -> dict[str, float]:
    """Two busy processes of one new session, each doing fixed chunks of Python work.

    ``cores``: CPU-seconds per second they got. hetrun's local job runs in its
    own session; with the kernel's autogroup scheduling, sessions (not
    processes) share the CPUs fairly, so this is how many cores a job could
    use at the moment: 2.0 on an idle 2-core machine, and the ceiling of any
    pipelining speed-up when other sessions are busy. ``speed``: chunks per
    CPU-second, the same fixed work whatever the share: when it moves between
    runs, the machine (not hetrun) got faster or slower.
    """
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _SPIN, _CHUNKS % seconds], capture_output=True,
                         text=True, start_new_session=True, check=True)
    wall = time.perf_counter() - t0
    cpu, chunks = out.stdout.split()
    # The interpreters' start-up is part of both the CPU time and the wall time.
    return {"cores": float(cpu) / max(wall, 1e-9), "speed": int(chunks) / max(float(cpu), 1e-9)}


# ------------------------------------------------------------------ report


def median_or_none(values: list[float | None]) -> float | None:
    """Median counting a run that never reached the threshold as infinitely slow."""
    if not values:
        return None
    med = statistics.median([float("inf") if v is None else v for v in values])
    return None if med == float("inf") else med


NAMES = {"pipelined": "(a) hetrun pipelined", "coarse": "(b) hetrun coarse (synchronous loop)",
         "pipelined_eval": "(a') hetrun pipelined + the example's evaluation schedule",
         "sb3": "(c) stable-baselines3 PPO"}


def name_of(mode: str) -> str:
    if mode in NAMES:
        return NAMES[mode]
    peer, vec, threads = peer_config(mode)
    what = {"sb3": "stable-baselines3", "cleanrl": "CleanRL-style (benchmarks/cleanrl_ppo.py)"}[peer]
    envs = {"dummy": "DummyVecEnv", "subproc": "SubprocVecEnv", "sync": "SyncVectorEnv",
            "async": "AsyncVectorEnv", "envpool": "EnvPool"}[vec]
    return f"(c) {what}, {envs}, {threads} torch thread{'s' if threads > 1 else ''}"


def mode_order(modes: Any) -> list[str]:
    """hetrun's modes first, then the peers in PEER_MODES order (others after)."""
    first = ["pipelined", "pipelined_eval", "coarse", "sb3", *PEER_MODES]
    return sorted(modes, key=lambda m: first.index(m) if m in first else len(first))


def best_peer(runs: dict[str, list[dict[str, Any]]], key: str = "steady_steps_per_s") -> str | None:
    """The peer configuration with the highest median ``key`` (the one hetrun is held to)."""
    meds = {m: v for m in runs if is_peer(m) and (v := _med(runs[m], key)) is not None}
    return max(meds, key=meds.__getitem__) if meds else None


def _by_mode(results: list[dict[str, Any]], phase: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["phase"] == phase and not r.get("failed"):
            out.setdefault(r["mode"], []).append(r)
    return out


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    """Median over the runs that have ``key`` (a run stopped within its warm-up has no steady rate);
    None when none has it."""
    got = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(got) if got else None


def _speed_table(speed: dict[str, list[dict[str, Any]]], iterations: int) -> list[str]:
    warm = warmup_updates(iterations)
    width = steady_windows(iterations, warm)[0]
    lines = [f"Throughput: {iterations} updates x 1024 env steps, no evaluation; steady state = median "
             f"over windows of {width[1] - width[0]} updates of updates {warm}..{iterations - 1} "
             f"(the first {warm} carry the one-time start-up, reported apart).", "",
             "| run | steady env steps/s | start-up (s) | whole-run env steps/s | actions/s | "
             "busy: learner core / rollout core | R / L busy s per update | "
             "rollout time overlapped by learner work | drift: last third vs first |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode in mode_order(speed):
        runs = speed[mode]
        if is_peer(mode):
            aps, rl = "n/a (one loop)", "n/a"
            busy = (f"one loop (+ its env workers): {statistics.median(r['busy']['process'] for r in runs):.0%}"
                    " of 2 cores")
            overlap = "0% (one loop)"
        else:
            overlap = f"{statistics.median(r['overlap'] for r in runs):.0%}"
            aps = f"{_med(runs, 'actions_per_s'):,.1f}"
            busy = " / ".join(f"{statistics.median(r['busy'][c] for r in runs):.0%}"
                              for c in ("learner", "rollout"))
            rl = f"{_med(runs, 'rollout_busy_s'):.4f} / {_med(runs, 'learner_busy_s'):.4f}"
        drifts = [d for r in runs if (d := drift(r["window_s_per_update"])) is not None]
        moved = f"{statistics.median(drifts):+.1%}" if drifts else "-"
        lines.append(f"| {name_of(mode)} | {_med(runs, 'steady_steps_per_s'):,.0f} | "
                     f"{_med(runs, 'startup_s'):.2f} | {_med(runs, 'steps_per_s'):,.0f} | {aps} | "
                     f"{busy} | {rl} | {overlap} | {moved} |")
    return lines


def pipelining_ratio(speed: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """(a)/(b) steady env steps/s per seed (the two runs taken back to back, so the machine's
    speed of that minute hits both), median over seeds; next to it the bound (R+L)/max(R,L)
    from the coarse and from the pipelined runs' own busy seconds (medians over seeds)."""
    coarse = {r["seed"]: r for r in speed.get("coarse", [])}
    pairs = [(r, coarse[r["seed"]]) for r in speed.get("pipelined", []) if r["seed"] in coarse]
    if not pairs:
        return None
    return {"ratio": statistics.median(p["steady_steps_per_s"] / c["steady_steps_per_s"] for p, c in pairs),
            "per_seed": [p["steady_steps_per_s"] / c["steady_steps_per_s"] for p, c in pairs],
            "bound_coarse": statistics.median(c["bound"] for _, c in pairs),
            "bound_pipelined": statistics.median(p["bound"] for p, _ in pairs)}


def _ratio_line(got: dict[str, Any], iterations: int) -> str:
    per_seed = ", ".join(f"{x:.2f}x" for x in got["per_seed"])
    return (f"(a) / (b) steady env steps/s at {iterations} updates: **{got['ratio']:.2f}x** "
            f"(per seed {per_seed}); bound (R+L)/max(R,L) from the runs' own busy seconds: "
            f"coarse {got['bound_coarse']:.2f}x, pipelined {got['bound_pipelined']:.2f}x "
            f"({got['ratio'] / got['bound_coarse']:.0%} of the coarse bound)")


def _speed_report(results: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    got: dict[int, dict[str, Any]] = {}
    for phase, iterations in (("speed", args.speed_iterations), ("speed2x", 2 * args.speed_iterations)):
        runs = _by_mode(results, phase)
        if not runs:
            continue
        lines += [*_speed_table(runs, iterations), ""]
        ratio = pipelining_ratio(runs)
        if ratio:
            got[iterations] = ratio
            lines.append(_ratio_line(ratio, iterations))
        if "pipelined" in runs and "coarse" in runs:
            whole = _med(runs["pipelined"], "steps_per_s") / _med(runs["coarse"], "steps_per_s")
            lines += [f"(a) / (b) whole-run env steps/s, start-up included: {whole:.2f}x", ""]
    if len(got) == 2:
        short, long = got[args.speed_iterations], got[2 * args.speed_iterations]
        change = long["ratio"] / short["ratio"] - 1
        lines.append(f"steadiness: (a)/(b) {long['ratio']:.2f}x at {2 * args.speed_iterations} updates vs "
                     f"{short['ratio']:.2f}x at {args.speed_iterations}: {change:+.1%} -> "
                     f"{'STEADY' if abs(change) < 0.05 else 'NOT steady'} (rule: within 5%)")
    lines += _peer_lines(_by_mode(results, "speed"))
    stale = [r["mean_staleness"] for r in results
             if r["mode"] == "pipelined" and r["phase"] != "ttt" and r["mean_staleness"] is not None]
    if stale:
        lines.append(f"(a) mean staleness of the learned batches: {statistics.fmean(stale):.2f} "
                     f"policy versions (window {args.window})")
    return lines


def _probe_line(results: list[dict[str, Any]]) -> str:
    probes = [r["probe"] for r in results if r.get("probe")]
    if not probes:
        return ""
    speeds = [p["speed"] for p in probes]
    return (f"machine probe before each run (2 processes of fixed Python work in one session): "
            f"cores a job could get {min(p['cores'] for p in probes):.2f}-"
            f"{max(p['cores'] for p in probes):.2f}; work per CPU-second {min(speeds):.0f}-"
            f"{max(speeds):.0f} chunks (median {statistics.median(speeds):.0f}, spread "
            f"{max(speeds) / min(speeds) - 1:.0%}: how much the machine's own speed moved)")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    failed = [f"{name_of(r['mode'])} ({r['phase']}, seed {r['seed']}): {r['failed']}"
              for r in results if r.get("failed")]
    lines = [f"Median of seeds {args.seeds}.", "", *(["left out: " + "; ".join(failed), ""] if failed else []),
             *_speed_report(results, args)]
    if _by_mode(results, "ttt"):
        lines += _ttt_report(results, args)
    lines += ["", f"load average (1 min) before: {args.load_before}, after: "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", _probe_line(results)]
    return "\n".join(lines)


def _ttt_report(results: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = ["", f"Time to CartPole-v1's reward_threshold (475, mean of 20 sampled-action "
              f"evaluation episodes every {args.eval_interval} updates, at most "
              f"{args.iterations} updates); median of seeds {args.seeds}.", "",
              "| run | time to 475 (s) | from launch (s) | per seed (s) | updates to 475 per seed |",
              "|---|---|---|---|---|"]
    ttt = _by_mode(results, "ttt")
    for mode in mode_order(ttt):
        runs = ttt[mode]
        med = median_or_none([r["solved_at_s"] for r in runs])
        launch = median_or_none([r.get("solved_from_launch_s") for r in runs])
        per = ", ".join("not reached" if r["solved_at_s"] is None else f"{r['solved_at_s']:.1f}"
                        for r in runs)
        vers = ", ".join("-" if r["solved_version"] is None else str(int(r["solved_version"]))
                         for r in runs)
        lines.append(f"| {name_of(mode)} | {'not reached' if med is None else f'**{med:.1f}**'} | "
                     f"{'-' if launch is None else f'{launch:.1f}'} | {per} | {vers} |")
    a = median_or_none([r["solved_at_s"] for r in ttt.get("pipelined", [])])
    peers = {m: median_or_none([r["solved_at_s"] for r in runs]) for m, runs in ttt.items() if is_peer(m)}
    reached = {m: v for m, v in peers.items() if v is not None}
    if reached:
        fastest = min(reached, key=lambda m: reached[m])
        verdict = ("not reached by (a)" if a is None else
                   f"**{reached[fastest] / a:.2f}x** -> {'met' if a <= reached[fastest] else 'miss'}")
        lines += ["", f"fastest peer to 475: {name_of(fastest)} {reached[fastest]:.1f} s; "
                      f"its time / (a)'s: {verdict} (target: (a) no slower)"]
    return lines


def _peer_lines(speed: dict[str, list[dict[str, Any]]]) -> list[str]:
    """(a) against the best peer configuration, and (a') with evaluation against (a) without."""
    lines = []
    best = best_peer(speed)
    if best and "pipelined" in speed:
        got = _med(speed["pipelined"], "steady_steps_per_s") / _med(speed[best], "steady_steps_per_s")
        lines.append(f"best peer configuration: {name_of(best)}, {_med(speed[best], 'steady_steps_per_s'):,.0f} "
                     f"steady env steps/s; (a) / best peer: **{got:.2f}x** -> "
                     f"{'met' if got >= 1.25 else 'miss'} (target >= 1.25x)")
    if "pipelined" in speed and "pipelined_eval" in speed:
        got = _med(speed["pipelined_eval"], "steady_steps_per_s") / _med(speed["pipelined"], "steady_steps_per_s")
        lines.append(f"(a') with evaluation / (a) without: **{got:.2f}** -> "
                     f"{'met' if got >= 0.9 else 'miss'} (target: within 10%)")
        cost = [r["eval_cost_in_run"] for r in speed["pipelined_eval"] if r.get("eval_cost_in_run") is not None]
        if cost:
            where = ", ".join(sorted({f"the {r.get('eval_on', 'learner')}, {r.get('rollout_ranks', 1)} "
                                      "rollout rank(s)" for r in speed["pipelined_eval"]}))
            lines.append(f"(a') inside its own run (eval on {where}): the update that evaluated "
                         f"and the two after it took **{statistics.median(cost):+.1%}** of the steady time "
                         f"beyond the other updates' median period (per seed "
                         f"{', '.join(f'{c:+.1%}' for c in cost)}) -> "
                         f"{'met' if statistics.median(cost) <= 0.10 else 'miss'} (target: within 10%)")
        runs = [r for r in speed["pipelined_eval"] if r.get("eval_s_per_step")
                and r.get("eval_on", "learner") == "learner"]
        if runs:
            per_step = _med(runs, "eval_s_per_step")
            update = _med(runs, "learner_update_s") * runs[0].get("eval_interval", 5)
            lines.append(f"(a') inside its own run: {per_step * 1e6:.0f} us per batched evaluation step, "
                         f"so {per_step * 500:.3f} s per evaluation of a solved policy (500 steps) against "
                         f"the learner's {update:.3f} s for the updates between two evaluations: "
                         f"evaluation adds {per_step * 500 / update:.0%} to the learner once solved")
    if "pipelined" in speed:
        p = speed["pipelined"]
        b = _med(p, "bound")
        coarse = speed.get("coarse")
        if coarse:
            # Like with like: the ratio's baseline is (b), so the bound is (b)'s: R and L each side
            # alone, as a perfect pipeline would keep them. (a)'s own R and L (the old line's
            # bound) run at once on the 2 cores and stretch when the machine cannot give both a
            # full core; that share is printed apart, not counted as the pipeline idling.
            ratio = _med(p, "steady_steps_per_s") / _med(coarse, "steady_steps_per_s")
            bc = _med(coarse, "bound")
            lines.append(f"(a) / (b) {ratio:.2f}x vs bound (R+L)/max(R,L) of (b)'s own R and L {bc:.2f}x: "
                         f"{ratio / bc:.0%} of it -> {'met' if ratio / bc >= 0.9 else 'miss'} "
                         f"(target: within 10%); with (a)'s own R and L, {b:.2f}x: {ratio / b:.0%}")
            stretch = ((_med(p, "rollout_busy_s") + _med(p, "learner_busy_s"))
                       / (_med(coarse, "rollout_busy_s") + _med(coarse, "learner_busy_s")))
            lines.append(f"(a)'s R+L over (b)'s: {stretch:.2f} (the two sides' work, running at once, "
                         f"vs one at a time: the machine's share, not the schedule)")
        eff = [r["efficiency"] for r in p if r.get("efficiency")]
        if eff:
            lines.append(f"(a) the pipeline's own efficiency, max(R,L) / period window by window: "
                         f"**{statistics.median(eff):.0%}** (per seed {', '.join(f'{x:.0%}' for x in eff)}; "
                         f"100% = never idle on its busiest side)")
    return lines


def run_order(args: argparse.Namespace) -> list[tuple[int, str, list[str]]]:
    """(seed, phase, modes in run order). Phase order flips from seed to seed and mode order
    from one phase to the next, so a machine that slows down over the minutes of the benchmark
    hits the short and the doubled runs, and (a) and (b), alike. The doubled runs only compare
    (a) with (b): the peers are left out of them; (a') only runs in the speed phase (in the
    time-to-threshold phase every run evaluates)."""
    order, flip = [], False
    for k, seed in enumerate(args.seeds):
        for phase in (args.phases if k % 2 == 0 else args.phases[::-1]):
            modes = [m for m in args.modes if not (phase == "speed2x" and is_peer(m))
                     and not (phase != "speed" and m == "pipelined_eval")]
            order.append((seed, phase, modes[::-1] if flip else modes))
            flip = not flip
    return order


def run_one(seed: int, phase: str, mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    iterations, every = {"speed": (args.speed_iterations, 0),
                         "speed2x": (2 * args.speed_iterations, 0),
                         "ttt": (args.iterations, args.eval_interval)}[phase]
    if mode == "pipelined_eval":  # the example's evaluation schedule, timed as throughput
        every = args.eval_interval
    probe = machine_probe()
    r = (run_peer(mode, seed, iterations, every, args) if is_peer(mode)
         else run_hetrun(mode, seed, iterations, every, args, workdir))
    r.pop("solved_wall", None)
    r.update(phase=phase, probe=probe, eval_interval=every)
    if r.get("failed"):
        print(f"seed {seed} {phase:7s} {mode:17s}: {r['failed']}", flush=True)
        return r
    solved = f" (steady {r['steady_steps_per_s']:,.0f})" if phase != "ttt" else (
        f", solved at {r['solved_at_s']:.1f} s" if r["solved_at_s"] is not None else ", not solved")
    print(f"seed {seed} {phase:7s} {mode:17s}: {r['steps_per_s']:8,.0f} steps/s{solved}; probe before: "
          f"{probe['cores']:.2f} cores, speed {probe['speed']:.0f}", flush=True)
    return r


def main() -> None:
    from local_job import cancel_on_sigterm

    cancel_on_sigterm()  # a kill cancels the running job too
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--speed-iterations", type=int, default=200,
                    help="updates of the throughput runs (no evaluation); long enough to be steady")
    ap.add_argument("--steady-check", action=argparse.BooleanOptionalAction, default=True,
                    help="also run (a) and (b) at twice --speed-iterations and print how much the "
                         "(a)/(b) ratio moves (phase speed2x; on by default)")
    ap.add_argument("--iterations", type=int, default=60,
                    help="updates of the time-to-threshold runs")
    ap.add_argument("--eval-interval", type=int, default=5)
    ap.add_argument("--eval-on", choices=["learner", "rollout"], default="rollout",
                    help="the component that evaluates in hetrun's runs (rollout: as the example ships)")
    ap.add_argument("--rollout-ranks", type=int, default=1,
                    help="rollout ranks of hetrun's jobs (the example ships 2: 3 ranks on the 2 cores)")
    ap.add_argument("--window", type=int, default=1, help="tolerance window of the rollout (a)")
    ap.add_argument("--modes", nargs="+", default=["pipelined", "pipelined_eval", "coarse", *PEER_MODES],
                    help="hetrun: pipelined, pipelined_eval (pipelined with evaluation every "
                         "--eval-interval in the throughput runs), coarse; peers: "
                         + ", ".join(PEER_MODES))
    ap.add_argument("--phases", nargs="+", default=["speed", "ttt"],
                    choices=["speed", "speed2x", "ttt"])
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep job files and run directories here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write all results here")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="report over these --json files (e.g. one per seed, each run in its own "
                         "lock hold) instead of running")
    ap.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sb3-vec", default="dummy", help=argparse.SUPPRESS)
    ap.add_argument("--sb3-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sb3_worker:
        print(json.dumps(sb3_worker(args.seeds[0], args.iterations, args.eval_interval,
                                    args.sb3_vec, args.sb3_threads)))
        return
    for mode in args.modes:
        if mode not in NAMES:
            peer_config(mode)  # a clear error for a misspelt mode, before anything runs
    if args.merge:
        results = [r for f in args.merge for r in json.loads(f.read_text())["runs"]]
        argv = json.loads(args.merge[0].read_text()).get("argv", [])
        if "--speed-iterations" in argv:  # the tables' headers say what the runs did
            args.speed_iterations = int(argv[argv.index("--speed-iterations") + 1])
        args.seeds = sorted({r["seed"] for r in results})
        args.load_before = "; ".join(json.loads(f.read_text())["load_before"] for f in args.merge)
        print(report(results, args))
        return
    if args.steady_check and "speed" in args.phases and "speed2x" not in args.phases:
        args.phases.insert(args.phases.index("speed") + 1, "speed2x")
    args.load_before = f"{os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory(prefix="ppo-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = []
        for seed, phase, modes in run_order(args):
            for mode in modes:
                results.append(run_one(seed, phase, mode, args, workdir))
                if args.json:  # after every run: a hold that ends early keeps what it measured
                    args.json.write_text(json.dumps({"load_before": args.load_before, "argv": sys.argv[1:],
                                                     "load_after": None, "runs": results}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"load_before": args.load_before, "argv": sys.argv[1:],
                                         "load_after": f"{os.getloadavg()[0]:.2f}", "runs": results},
                                        indent=1))
    print()
    print(report(results, args))


if __name__ == "__main__":
    main()

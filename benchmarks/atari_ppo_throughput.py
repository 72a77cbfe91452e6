"""Atari PPO throughput, side by side in one run on the same cores: pipelined vs coarse vs peers.

(a) hetrun pipelined: examples/ppo_atari.yaml through the local backend
    (mpirun): one learner rank, ``--rollouts`` rollout ranks, rollouts up to one
    policy version stale;
(b) coarse: the same job with ``training.mode: coarse`` (synchronous loop);
(c) peers at their best on the same 2 cores, same hyper-parameters, same IMPALA
    network, num_envs = the hetrun job's envs across its rollout ranks:
    stable-baselines3 PPO (the example's wrappers, the encoder as its features
    extractor; ``sb3:<dummy|subproc>:<torch threads>``) and a CleanRL-style
    single-file PPO (benchmarks/cleanrl_ppo.py; ``cleanrl:<sync|async|envpool>:
    <threads>``, EnvPool with CleanRL's ppo_atari_envpool settings).
    hetrun: 1 torch thread per rank unless ``--learner-threads`` (``auto``: the
    learner's update uses the cores the rollout leaves idle in its phase).

Also: the raw single-core rate of the same wrapped env (a bare loop, random
actions) and of EnvPool with one thread, measured in the same run, against
the rollout rank's env steps per busy second; and the time (and the env steps)
until the mean real score of the last 20 training games reaches ``--target-return``,
counted alike on every side: at least 5 finished games in the mean, and the env
steps whose games that mean covers (``env_steps_at_target``), not those run until
the run was stopped.

Steady-state env steps/s (updates after the first tenth, at least 2, are the
steady window; start-up apart), actions/s, and for (a)/(b) the busy seconds per
update of rollout (R) and learner (L) with the bound (R+L)/max(R,L): the most a
perfect pipeline of the two can gain over running them in turn. Helpers are
benchmarks/ppo_pipeline.py's, so both PPO benchmarks measure alike.

The network is the example's default (examples/ppo_atari.yaml: IMPALA widths
16/32/32, 256 hidden, lr 2.5e-4; 2 epochs x 8 minibatches); ``--width``/``--hidden``
change it. At that width one update takes ~5 s of rollout and ~11 s of
learning on one core here, so the default is 10 updates (the first 2 are
start-up, 8 are steady).

    python benchmarks/atari_ppo_throughput.py --updates 5 --modes pipelined coarse sb3:dummy:2 \
        cleanrl:envpool:2 --json a.json                          # ~8 minutes here; --merge a.json b.json
    python benchmarks/atari_ppo_throughput.py                  # every mode, long
    python benchmarks/atari_ppo_throughput.py --updates 3 --width 4 --hidden 64   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_job import cancel_on_sigterm, cancelled_on_failure
from ppo_pipeline import (
    best_peer,
    is_peer,
    name_of,
    peer_config,
    steady_state,
    summarize_events,
    warmup_updates,
)

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "ALE/Frostbite-v5"


def hyper(args: argparse.Namespace) -> dict[str, Any]:
    extra = {} if args.learner_threads is None else {"learner_threads": args.learner_threads}
    return {**extra, "env_id": ENV_ID, "num_envs": args.envs, "num_steps": 128, "learning_rate": 2.5e-4,
            "update_epochs": 2, "num_minibatches": 8, "impala_width": args.width, "hidden": args.hidden,
            "clip_coef": 0.1, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5, "gamma": 0.99,
            "gae_lambda": 0.95}


# The peer configurations worth trying on 2 cores (the same names as benchmarks/ppo_pipeline.py's).
PEER_MODES = ["sb3:dummy:1", "sb3:dummy:2", "sb3:subproc:1", "sb3:subproc:2",
              "cleanrl:sync:2", "cleanrl:async:2", "cleanrl:envpool:1", "cleanrl:envpool:2"]


def run_hetrun(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from hetrun.dag.overrides import Overrides
    from hetrun.runtime.events import read_events
    from hetrun.slurm_plugin.submit import backend_for, submit_file, wait_for_end

    from hetrun.errors import HetrunError

    # "pipelined@32": the same run with workload_args.precision 32 (the example's default: auto,
    # bf16-mixed on a CPU with native bf16: examples/learner_precision.py). "pipelined+plain":
    # staleness_correction none (plain PPO on stale batches; the example's default: decoupled).
    name = mode
    mode, _, plain = mode.partition("+")
    mode, _, precision = mode.partition("@")
    h = hyper(args)
    if precision:
        h["precision"] = f'"{precision}"'
    if plain:
        if plain != "plain":
            raise SystemExit(f"unknown mode suffix +{plain} in {name!r} (only +plain)")
        h["staleness_correction"] = "none"
    wl = ", ".join(f"{k}: {v}" for k, v in h.items())
    sets = [f"training.mode={mode}", f"training.iterations={args.updates}", "training.eval_interval=0",
            "checkpoint.interval=0", f"components.rollout.nodes={args.rollouts}", f"workload_args={{{wl}}}",
            f"training.seed={args.seed}"]
    launched = time.time()
    res = submit_file(REPO / "examples" / "ppo_atari.yaml", Overrides(sets=sets), backend="local",
                      runs_dir=workdir / "runs")
    backend = backend_for(res.run)
    deadline = time.monotonic() + args.run_timeout
    stopped = False
    with cancelled_on_failure(backend, res.run):
        while True:  # in slices: --stop-at-target looks at the run's events between them
            try:
                status = wait_for_end(res.run, backend, timeout_s=5.0, poll_s=0.5)
                break
            except HetrunError:
                if time.monotonic() > deadline:
                    raise
            if args.stop_at_target and time_to_return(list(read_events(res.run.run_dir)),
                                                      args.target_return)["solved_at_s"] is not None:
                backend.cancel(res.run)
                status, stopped = wait_for_end(res.run, backend, timeout_s=60, poll_s=0.5), True
                break
    if not stopped and any(c.state != "COMPLETED" for c in status.components):
        raise SystemExit(f"hetrun {mode} run failed: {status.components} ({res.run.run_dir})")
    events = list(read_events(res.run.run_dir))
    out = summarize_events(events, cores={"learner": 1, "rollout": args.rollouts})
    # Per update: the mean number of threads its minibatch steps ran on (learner_threads auto).
    out["update_threads"] = [e["metrics"]["update_threads"] for e in events
                             if e.get("ev") == "action" and "update_threads" in e.get("metrics", {})]
    import torch
    from hetrun.examples.learner_precision import resolve

    out.update(precision=resolve(precision or "auto", torch.device("cpu")))  # type: ignore[arg-type]
    reached = time_to_return(events, args.target_return)
    out.update(mode=name, seed=args.seed, run_dir=str(res.run.run_dir), stopped_at_target=stopped,
               launch_s=reached.pop("first_action") - launched, **reached)
    return out


# The peers' rule (sb3_worker below, benchmarks/cleanrl_ppo.py): no mean over fewer finished games.
MIN_GAMES = 5


def time_to_return(events: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """When the mean real score of the last 20 finished training games first reached ``target``
    (the learner's ``episodic_return`` metric, at the end of that update, once at least
    ``MIN_GAMES`` games have finished: the peers' rule), from the first action (``first_action``:
    its wall-clock start); ``env_steps_at_target``: the learner's ``env_steps`` at that update,
    the samples whose games the mean covers (session 21: the run's own count at --stop-at-target
    also held the batches run while the poll noticed, 1-2 of them, where SB3's stops at the hit)."""
    actions = [e for e in events if e.get("ev") == "action" and not e.get("skipped")]
    if not actions:
        return {"solved_at_s": None, "training_return": None, "first_action": None,
                "env_steps_at_target": None}
    t0 = min(e["start"] for e in actions)
    updates = sorted((e for e in actions if "episodes" in e.get("metrics", {})
                      or "episodic_return" in e.get("metrics", {})), key=lambda e: e["end"])
    games, hit, last = 0, None, None
    for e in updates:
        m = e["metrics"]
        games += round(m.get("episodes", 0))  # games finished in this update's batch
        if "episodic_return" not in m:
            continue
        last = m["episodic_return"]
        if hit is None and games >= MIN_GAMES and last >= target:
            hit = e
    return {"solved_at_s": None if hit is None else hit["end"] - t0, "training_return": last,
            "first_action": t0,
            "env_steps_at_target": None if hit is None else int(hit["metrics"]["env_steps"])}


def sb3_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One process; prints one JSON line. ``--sb3-vec``: DummyVecEnv or SubprocVecEnv;
    ``--sb3-threads``: torch threads."""
    import torch
    from hetrun.examples.atari_envs import AtariSettings, make_atari_env
    from hetrun.examples.atari_ppo import ImpalaEncoder
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

    torch.set_num_threads(args.sb3_threads)
    h = hyper(args)
    settings = AtariSettings(env_id=ENV_ID)

    class Impala(BaseFeaturesExtractor):
        def __init__(self, observation_space: Any, width: int, hidden: int) -> None:
            super().__init__(observation_space, features_dim=hidden)
            self.encoder = ImpalaEncoder(settings.obs_shape, width, hidden)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.encoder(obs)  # SB3 hands float frames (normalize_images off): /255 inside

    n_envs = h["num_envs"] * args.rollouts
    cls = DummyVecEnv if args.sb3_vec == "dummy" else SubprocVecEnv
    envs = cls([lambda: make_atari_env(settings) for _ in range(n_envs)])
    envs.seed(args.seed)
    envs = VecMonitor(envs)  # per training episode (a life): the real score is read below
    batch = n_envs * h["num_steps"]
    model = PPO("CnnPolicy", envs, n_steps=h["num_steps"], batch_size=batch // h["num_minibatches"],
                n_epochs=h["update_epochs"], learning_rate=h["learning_rate"], gamma=h["gamma"],
                gae_lambda=h["gae_lambda"], clip_range=h["clip_coef"], ent_coef=h["ent_coef"],
                # SB3's value loss is the plain MSE, hetrun's (CleanRL's) 0.5 x MSE: half the
                # coefficient gives the same loss.
                vf_coef=0.5 * h["vf_coef"], max_grad_norm=h["max_grad_norm"], normalize_advantage=True,
                policy_kwargs={"features_extractor_class": Impala, "normalize_images": False,
                               "features_extractor_kwargs": {"width": h["impala_width"], "hidden": h["hidden"]},
                               "net_arch": [], "share_features_extractor": True},
                seed=args.seed, device="cpu", verbose=0)
    ends: dict[int, float] = {}
    scores: list[float] = []
    solved: dict[str, Any] = {"solved_at_s": None, "env_steps_at_target": None}

    class Clock(BaseCallback):
        def _on_rollout_start(self) -> None:
            version = self.model.num_timesteps // batch
            if version:
                ends[version - 1] = time.time()
            # Real game scores (examples/atari_envs.py's GameScore, read through the VecEnv).
            for finished in self.training_env.env_method("pop_game_scores"):
                scores.extend(finished)
            recent = scores[-20:]
            if (solved["solved_at_s"] is None and len(recent) >= MIN_GAMES
                    and sum(recent) / len(recent) >= args.target_return):
                solved["solved_at_s"] = time.time() - started
                # The rollouts whose games these are: all collected so far (this one starts now).
                solved["env_steps_at_target"] = int(self.model.num_timesteps)

        def _on_training_end(self) -> None:
            ends.setdefault(max(1, self.model.num_timesteps // batch) - 1, time.time())

        def _on_step(self) -> bool:
            return not (args.stop_at_target and solved["solved_at_s"] is not None)

    started = time.time()
    cpu0 = time.process_time()
    model.learn(total_timesteps=args.updates * batch, callback=Clock())
    span = time.time() - started
    steps = int(model.num_timesteps)
    envs.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + children.ru_utime + children.ru_stime
    recent = scores[-20:]
    return {"env_steps": steps, "span_s": span, "steps_per_s": steps / span, "started_wall": started,
            "actions": None, "actions_per_s": None, "busy": {"process": cpu / (2 * span)},
            "training_return": sum(recent) / len(recent) if recent else None, **solved,
            **steady_state(ends, started, batch, warmup_updates(args.updates))}


def run_peer(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    peer, vec, threads = peer_config(mode)
    common = ["--updates", str(args.updates), "--seed", str(args.seed), "--target-return", str(args.target_return),
              *(["--stop-at-target"] if args.stop_at_target else [])]
    if peer == "sb3":
        cmd = [sys.executable, __file__, "--sb3-worker", "--envs", str(args.envs), "--rollouts", str(args.rollouts),
               "--width", str(args.width), "--hidden", str(args.hidden), "--sb3-vec", vec,
               "--sb3-threads", str(threads), *common]
    else:
        h = {**hyper(args), "num_envs": args.envs * args.rollouts}
        h.pop("learner_threads", None)
        cmd = [sys.executable, str(Path(__file__).with_name("cleanrl_ppo.py")), "--family", "atari", "--vec", vec,
               "--threads", str(threads), "--hyper", json.dumps(h), *common]
    launched = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    except subprocess.TimeoutExpired:
        # A configuration this slow is no contender: recorded, left out of the tables.
        return {"mode": mode, "seed": args.seed, "failed": f"did not finish within {args.run_timeout:.0f} s"}
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # Launch -> the first training step (the process, its imports, the environments, the network):
    # outside solved_at_s, which counts from that first step on every side; hetrun's is its submission
    # -> first action (run_hetrun).
    out["launch_s"] = out["started_wall"] - launched
    if "env_steps_at_target" not in out:  # cleanrl_ppo.py: the update that reached it
        version = out.get("solved_version")
        out["env_steps_at_target"] = None if version is None else version * args.envs * args.rollouts * 128
    out.update(mode=mode, seed=args.seed)
    return out


def raw_ale_rate(seconds: float = 8.0) -> dict[str, float]:
    """Agent steps/s (4 frames each) of a bare single-thread loop, random actions, one core:
    the example's preprocessed env (examples/atari_envs.py) and, where it is installed,
    EnvPool with one thread (the ~1,200 steps/s per core EnvPool reports)."""
    import numpy as np
    from hetrun.examples.atari_envs import AtariSettings, make_atari_env

    env = make_atari_env(AtariSettings(env_id=ENV_ID))
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        n += 1
        if term or trunc:
            env.reset()
    out = {"gymnasium_wrapped": n / (time.perf_counter() - t0)}
    env.close()
    try:
        import envpool
    except ImportError:
        return out
    pool = envpool.make(ENV_ID.removeprefix("ALE/"), env_type="gymnasium", num_envs=1, num_threads=1,
                        episodic_life=True, reward_clip=True, repeat_action_probability=0.0, noop_max=30)
    pool.reset()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pool.step(rng.integers(pool.action_space.n, size=1).astype(np.int32))
        n += 1
    out["envpool_1_thread"] = n / (time.perf_counter() - t0)
    pool.close()
    return out


def _by_mode(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        out.setdefault(r["mode"], []).append(r)
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def is_hetrun(mode: str) -> bool:
    """pipelined or coarse, with an @precision and/or +plain (see run_hetrun)."""
    return mode.partition("+")[0].partition("@")[0] in ("pipelined", "coarse")


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    got = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(got) if got else None


def _solved_med(runs: list[dict[str, Any]]) -> float | None:
    """Median time to the fixed return, a run that never reached it counting as infinitely slow."""
    med = statistics.median([float("inf") if r.get("solved_at_s") is None else r["solved_at_s"] for r in runs])
    return None if med == float("inf") else med


def _steps_cell(runs: list[dict[str, Any]]) -> str:
    """Median env steps to the fixed return (a run that never reached it: infinitely many), per seed."""
    got = [r.get("env_steps_at_target") for r in runs]
    med = statistics.median([float("inf") if g is None else g for g in got])
    per = ", ".join("-" if g is None else f"{g / 1000:.1f}k" for g in got)
    return f"{'not reached' if med == float('inf') else f'{med / 1000:.1f}k'} ({per})"


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Medians over seeds, one row per mode; then the targets."""
    failed = [f"{name_of(r['mode'])} (seed {r['seed']}): {r['failed']}" for r in results if r.get("failed")]
    by = _by_mode([r for r in results if not r.get("failed")])
    lines = [*(["left out: " + "; ".join(failed), ""] if failed else []),f"{args.updates} updates x {args.envs * args.rollouts * 128} agent steps; medians over seeds "
             f"{sorted({r['seed'] for r in results})}; fixed return: mean real score of the last 20 "
             f"training games >= {args.target_return:g}", "",
             "| mode | steady env steps/s | per seed | start-up s | R s/update | L s/update | bound | "
             "busy (of 2 cores) | time to the fixed return (s) | env steps to it | last training return |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    first = ["pipelined", "coarse", *PEER_MODES]
    for mode in sorted(by, key=lambda m: first.index(m) if m in first else len(first)):
        runs = by[mode]
        per = ", ".join(_fmt(r["steady_steps_per_s"], ",.0f") for r in runs)
        solved = _solved_med(runs)
        busy = statistics.median(sum(r["busy"].values()) / (1 if is_peer(mode) else 2) for r in runs)
        cells = [_fmt(_med(runs, "steady_steps_per_s"), ",.1f"), per, _fmt(_med(runs, "startup_s"), ".1f"),
                 "-" if is_peer(mode) else f"{_med(runs, 'rollout_busy_s'):.2f}",
                 "-" if is_peer(mode) else f"{_med(runs, 'learner_busy_s'):.2f}",
                 "-" if is_peer(mode) else f"{_med(runs, 'bound'):.2f}x", f"{busy:.0%}",
                 "not reached" if solved is None else f"{solved:.0f}", _steps_cell(runs),
                 "-" if _med(runs, "training_return") is None else f"{_med(runs, 'training_return'):.0f}"]
        label = mode if is_hetrun(mode) else name_of(mode)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ratios(by, args))


def ratios(by: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> list[str]:
    """The targets: pipelined vs the best peer, vs its bound; rollout rate vs the raw ALE rate."""
    pipe, coarse = by.get("pipelined"), by.get("coarse")
    out = [""]
    best = best_peer({m: r for m, r in by.items() if is_peer(m)})
    if pipe and best:
        got = _med(pipe, "steady_steps_per_s") / _med(by[best], "steady_steps_per_s")
        out.append(f"best peer configuration: {name_of(best)}, {_med(by[best], 'steady_steps_per_s'):,.1f} "
                   f"steady env steps/s; pipelined / best peer: **{got:.2f}x** -> "
                   f"{'met' if got >= 1.25 else 'miss'} (target >= 1.25x)")
        peers_solved = {m: _solved_med(r) for m, r in by.items() if is_peer(m)}
        reached = {m: v for m, v in peers_solved.items() if v is not None}
        mine = _solved_med(pipe)
        if reached:
            fastest = min(reached, key=lambda m: reached[m])
            out.append(f"time to the fixed return (from each side's first training step): pipelined "
                       f"{'not reached' if mine is None else f'{mine:.0f} s'}, fastest peer {name_of(fastest)} "
                       f"{reached[fastest]:.0f} s -> "
                       f"{'met' if mine is not None and mine <= reached[fastest] else 'miss'} (target: no slower)")
            launched = {m: _med(by[m], "launch_s") for m in [*reached, "pipelined"]}
            if all(v is not None for v in launched.values()) and mine is not None:
                mine_l = mine + launched["pipelined"]
                peers_l = {m: reached[m] + launched[m] for m in reached}
                best_l = min(peers_l, key=lambda m: peers_l[m])
                out.append(f"... counting each side's launch (process start to first step: pipelined "
                           f"{launched['pipelined']:.1f} s, {name_of(best_l)} {launched[best_l]:.1f} s): "
                           f"{mine_l:.0f} s vs {peers_l[best_l]:.0f} s -> "
                           f"{'met' if mine_l <= peers_l[best_l] else 'miss'}")
        else:
            out.append(f"time to the fixed return: pipelined {'not reached' if mine is None else f'{mine:.0f} s'}; "
                       "no peer reached it within the budget")
    # A variant of the example (another learner precision, or +plain: no staleness correction).
    for mode in (m for m in by if is_hetrun(m) and m not in ("pipelined", "coarse") and best):
        got = _med(by[mode], "steady_steps_per_s") / _med(by[best], "steady_steps_per_s")
        solved = _solved_med(by[mode])
        out.append(f"{mode} (learner precision {by[mode][0].get('precision')}) / best peer: {got:.2f}x; time to "
                   f"the fixed return {'not reached' if solved is None else f'{solved:.0f} s'}")
    if pipe:
        out.append(f"pipelined's learner precision: {pipe[0].get('precision', '32 (before precision existed)')}")
    if pipe and coarse:
        got = _med(pipe, "steady_steps_per_s") / _med(coarse, "steady_steps_per_s")
        b = _med(coarse, "bound")
        out.append(f"pipelined / coarse steady env steps/s: {got:.2f}x; bound (R+L)/max(R,L) from the coarse "
                   f"runs' busy seconds {b:.2f}x: {got / b:.0%} of it -> "
                   f"{'met' if got / b >= 0.9 else 'miss'} (target: within 10%)")
    if pipe:
        busiest = statistics.median(max(r["rollout_busy_s"], r["learner_busy_s"]) / r["steady_s_per_update"]
                                    for r in pipe)
        out.append(f"pipelined period vs its busiest side max(R,L): {busiest:.0%} of a perfect pipeline")
        raw = getattr(args, "raw_ale", None)
        if raw:
            # Env steps one rollout rank produces per second of its own busy time (its core's rate).
            per_core = statistics.median(args.envs * 128 / r["rollout_busy_s"] for r in pipe)
            out.append(f"rollout rank: {per_core:,.0f} env steps/s per busy core = "
                       f"{per_core / raw['gymnasium_wrapped']:.0%} of the raw single-core rate of the same "
                       f"wrapped env ({raw['gymnasium_wrapped']:,.0f}/s, bare loop, random actions)"
                       + (f"; {per_core / raw['envpool_1_thread']:.0%} of EnvPool's 1-thread rate "
                          f"({raw['envpool_1_thread']:,.0f}/s)" if "envpool_1_thread" in raw else ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--envs", type=int, default=8, help="games per rollout rank")
    ap.add_argument("--rollouts", type=int, default=1, help="rollout ranks")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--modes", nargs="+", default=["pipelined", "coarse", *PEER_MODES],
                    help="hetrun: pipelined, coarse (@32 or @bf16-mixed: that learner precision instead of "
                         "the example's auto); peers: " + ", ".join(PEER_MODES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--learner-threads", default=None,
                    help="hetrun's workload_args.learner_threads (a number or auto; default: the example's)")
    ap.add_argument("--target-return", type=float, default=150.0,
                    help="the fixed return: mean real score of the last 20 training games (Frostbite's "
                         "uniform-random policy scores ~65)")
    ap.add_argument("--stop-at-target", action="store_true",
                    help="end each run once it reaches --target-return (time to the return is all it measures; "
                         "the steady rate then covers the updates run)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="report over these --json files (one per seed or lock hold) instead of running")
    ap.add_argument("--sb3-vec", default="dummy", help=argparse.SUPPRESS)
    ap.add_argument("--sb3-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sb3_worker:
        print(json.dumps(sb3_worker(args)))
        return
    cancel_on_sigterm()  # a kill cancels the running job too
    for mode in args.modes:
        if not is_hetrun(mode):
            peer_config(mode)  # a clear error for a misspelt mode, before anything runs
    if args.merge:
        docs = [json.loads(f.read_text()) for f in args.merge]
        results = [r for d in docs for r in d["runs"]]
        args.raw_ale = docs[0].get("raw_ale")
        print("loads: " + "; ".join(f"{d['load_before']} -> {d['load_after'] or '(ended early)'}" for d in docs))
        print(table(results, args))
        return
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    results = []
    args.raw_ale = raw_ale_rate()
    print(f"raw single-core rate: {args.raw_ale}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        for mode in args.modes:
            print(f"running {mode}", file=sys.stderr, flush=True)
            r = run_hetrun(mode, args, Path(tmp)) if is_hetrun(mode) else run_peer(mode, args)
            results.append(r)
            if args.json:  # after every run: a hold that ends early keeps what it measured
                args.json.write_text(json.dumps({"load_before": load, "load_after": None, "argv": sys.argv[1:],
                                                 "raw_ale": args.raw_ale, "runs": results}, indent=1))
            if r.get("failed"):
                print(f"  {mode}: {r['failed']}", file=sys.stderr, flush=True)
                continue
            print(f"  {mode}: steady {_fmt(r['steady_steps_per_s'], '.1f')} env steps/s, solved at "
                  f"{r.get('solved_at_s')} after {r.get('env_steps_at_target')} env steps, return "
                  f"{r.get('training_return')}", file=sys.stderr, flush=True)
    after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average before: {load}; after: {after}")
    print(table(results, args))
    if args.json:
        args.json.write_text(json.dumps({"load_before": load, "load_after": after, "argv": sys.argv[1:],
                                         "raw_ale": args.raw_ale, "runs": results}, indent=1))


if __name__ == "__main__":
    main()

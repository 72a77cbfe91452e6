"""Atari PPO throughput, side by side in one run on the same cores: pipelined vs coarse vs SB3.

(a) hetrun pipelined: examples/ppo_atari.yaml through the local backend
    (mpirun): one learner rank, ``--rollouts`` rollout ranks, rollouts up to one
    policy version stale;
(b) coarse: the same job with ``training.mode: coarse`` (synchronous loop);
(c) stable-baselines3 PPO with the same hyper-parameters, the same env
    wrappers (examples/atari_envs.py) and the same IMPALA encoder as its
    features extractor (shared by actor and critic, heads straight on it), in
    one process, num_envs = the hetrun job's envs across its rollout ranks.
    Every process runs torch with 1 thread (SB3: torch.set_num_threads(1);
    hetrun: workload_args.torch_threads 1) and OMP_NUM_THREADS=1.

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

    python benchmarks/atari_ppo_throughput.py                  # ~9 minutes here
    python benchmarks/atari_ppo_throughput.py --updates 3 --width 4 --hidden 64   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_pipeline import steady_state, summarize_events, warmup_updates

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "ALE/Frostbite-v5"


def hyper(args: argparse.Namespace) -> dict[str, Any]:
    return {"env_id": ENV_ID, "num_envs": args.envs, "num_steps": 128, "learning_rate": 2.5e-4,
            "update_epochs": 2, "num_minibatches": 8, "impala_width": args.width, "hidden": args.hidden,
            "clip_coef": 0.1, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5, "gamma": 0.99,
            "gae_lambda": 0.95}


def run_hetrun(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from hetrun.dag.overrides import Overrides
    from hetrun.runtime.events import read_events
    from hetrun.slurm_plugin.submit import backend_for, submit_file, wait_for_end

    from hetrun.errors import HetrunError

    wl = ", ".join(f"{k}: {v}" for k, v in hyper(args).items())
    sets = [f"training.mode={mode}", f"training.iterations={args.updates}", "training.eval_interval=0",
            "checkpoint.interval=0", f"components.rollout.nodes={args.rollouts}", f"workload_args={{{wl}}}"]
    res = submit_file(REPO / "examples" / "ppo_atari.yaml", Overrides(sets=sets), backend="local",
                      runs_dir=workdir / "runs")
    backend = backend_for(res.run)
    try:
        status = wait_for_end(res.run, backend, timeout_s=args.run_timeout, poll_s=0.5)
    except HetrunError:
        backend.cancel(res.run)  # never leave a benchmark job running
        raise
    if any(c.state != "COMPLETED" for c in status.components):
        raise SystemExit(f"hetrun {mode} run failed: {status.components} ({res.run.run_dir})")
    events = list(read_events(res.run.run_dir))
    out = summarize_events(events, cores={"learner": 1, "rollout": args.rollouts})
    out.update(mode=mode, run_dir=str(res.run.run_dir))
    return out


def sb3_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One process; prints one JSON line."""
    import torch
    from hetrun.examples.atari_envs import AtariSettings, make_atari_env
    from hetrun.examples.atari_ppo import ImpalaEncoder
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    h = hyper(args)
    settings = AtariSettings(env_id=ENV_ID)

    class Impala(BaseFeaturesExtractor):
        def __init__(self, observation_space: Any, width: int, hidden: int) -> None:
            super().__init__(observation_space, features_dim=hidden)
            self.encoder = ImpalaEncoder(settings.obs_shape, width, hidden)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.encoder(obs)  # SB3 hands float frames (normalize_images off): /255 inside

    n_envs = h["num_envs"] * args.rollouts
    envs = DummyVecEnv([lambda: make_atari_env(settings) for _ in range(n_envs)])
    envs.seed(0)
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
                seed=0, device="cpu", verbose=0)
    ends: dict[int, float] = {}

    class Clock(BaseCallback):
        def _on_rollout_start(self) -> None:
            version = self.model.num_timesteps // batch
            if version:
                ends[version - 1] = time.time()

        def _on_training_end(self) -> None:
            ends[args.updates - 1] = time.time()

        def _on_step(self) -> bool:
            return True

    started = time.time()
    cpu0 = time.process_time()
    model.learn(total_timesteps=args.updates * batch, callback=Clock())
    span = time.time() - started
    steps = int(model.num_timesteps)
    return {"mode": "sb3", "env_steps": steps, "span_s": span, "steps_per_s": steps / span,
            "actions": None, "actions_per_s": None,
            "busy": {"process": (time.process_time() - cpu0) / (2 * span)},
            **steady_state(ends, started, batch, warmup_updates(args.updates))}


def run_sb3(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--sb3-worker", "--updates", str(args.updates), "--envs", str(args.envs),
           "--rollouts", str(args.rollouts), "--width", str(args.width), "--hidden", str(args.hidden)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"SB3 run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| mode | steady env steps/s | start-up s | actions/s | R s/update | L s/update | bound "
             "| steady / bound x coarse |", "|---|---|---|---|---|---|---|---|"]
    coarse = next((r for r in results if r["mode"] == "coarse"), None)
    for r in results:
        eff = "-"
        if r["mode"] == "pipelined" and coarse and r.get("bound"):
            eff = f"{r['steady_steps_per_s'] / (r['bound'] * coarse['steady_steps_per_s']):.0%}"
        cells = [f"{r['steady_steps_per_s']:,.0f}", f"{r['startup_s']:.1f}",
                 "-" if r.get("actions_per_s") is None else f"{r['actions_per_s']:.2f}",
                 f"{r['rollout_busy_s']:.2f}" if "rollout_busy_s" in r else "-",
                 f"{r['learner_busy_s']:.2f}" if "learner_busy_s" in r else "-",
                 f"{r['bound']:.2f}x" if r.get("bound") else "-", eff]
        lines.append(f"| {r['mode']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ratios(results))


def ratios(results: list[dict[str, Any]]) -> list[str]:
    """pipelined / coarse next to its bound (R+L)/max(R,L), and pipelined / SB3."""
    by = {r["mode"]: r for r in results}
    pipe, coarse, sb3 = by.get("pipelined"), by.get("coarse"), by.get("sb3")
    out = [""]
    if pipe and coarse:
        got = pipe["steady_steps_per_s"] / coarse["steady_steps_per_s"]
        out.append(f"pipelined / coarse steady env steps/s: {got:.2f}x; bound (R+L)/max(R,L): "
                   f"{coarse['bound']:.2f}x from the coarse run's busy seconds, "
                   f"{pipe['bound']:.2f}x from the pipelined run's; "
                   f"{got / coarse['bound']:.0%} of the coarse bound (target: within 10%)")
    if pipe and pipe.get("learner_busy_s"):
        # Apart from the coarse run (whose cores may be slowed by other work at another
        # minute): how close the pipelined run's period comes to its own busiest side.
        busiest = max(pipe["rollout_busy_s"], pipe["learner_busy_s"])
        out.append(f"pipelined s/update {pipe['steady_s_per_update']:.2f} vs its busiest side max(R,L) "
                   f"{busiest:.2f}: {busiest / pipe['steady_s_per_update']:.0%} of a perfect pipeline")
    if pipe and sb3:
        out.append(f"pipelined / SB3 steady env steps/s: "
                   f"{pipe['steady_steps_per_s'] / sb3['steady_steps_per_s']:.2f}x (target > 1)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--envs", type=int, default=8, help="games per rollout rank")
    ap.add_argument("--rollouts", type=int, default=1, help="rollout ranks")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--modes", nargs="+", default=["pipelined", "coarse", "sb3"])
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sb3_worker:
        print(json.dumps(sb3_worker(args)))
        return
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    results = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        for mode in args.modes:
            print(f"running {mode}", file=sys.stderr, flush=True)
            results.append(run_sb3(args) if mode == "sb3" else run_hetrun(mode, args, Path(tmp)))
    print(f"load average before: {load}; after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

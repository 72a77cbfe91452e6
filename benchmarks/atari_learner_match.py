"""hetrun's Atari PPO and stable-baselines3's PPO compute the same thing on the same samples.

Backs benchmarks/atari.md's "Session 21" claim that the learners match (SB3 is the peer that
benchmarks/atari_ppo_throughput.py runs; this script builds both sides as that benchmark does:
``hyper()``'s hyper-parameters, the example's ``AtariPPOWorkload`` through its workload args,
SB3's ``PPO("CnnPolicy")`` with the example's ``ImpalaEncoder`` as its features extractor and
``vf_coef`` halved, its envs from ``make_atari_env`` in a ``DummyVecEnv`` + ``VecMonitor``).

Checks, each a measured difference against a tolerance:

1. env streams: hetrun's ``AtariVector`` and SB3's vector env, seeded alike, stepped with the
   same random actions: observations, clipped rewards, dones and the finished games' real
   scores must be identical (tolerance 0).
2. the learner on one batch: a hetrun rollout batch (``--envs`` x ``--steps``: the first one
   the rollout rank collects that holds a lost life and a reward) is copied into
   SB3's ``RolloutBuffer``; SB3's policy gets the hetrun learner's weights, and hetrun's update
   follows the minibatch order SB3 draws (``np.random.permutation``, seeded; the indices SB3
   used are recorded and must be that order). Both sides then run their own code:
   - behaviour values and log-probs: SB3's ``evaluate_actions`` against the rollout's;
   - GAE: SB3's ``compute_returns_and_advantage`` against hetrun's advantages and returns;
   - the first step's gradient (after the 0.5 norm clip, read in an optimizer pre-step hook),
     per tensor, relative;
   - the weights after each Adam step, per tensor, relative to the step SB3 took (step 1 is
     rounding only; later steps drift as Adam amplifies rounding, hence a looser bound);
   - the update's value loss (SB3 logs the plain MSE, hetrun 0.5 x MSE) and entropy.
   hetrun's update runs as the runtime runs it: the first step in the example's
   ``training.micro_batches`` micro-batches, the later ones in ``update_parts`` parts.
3. bf16-mixed (the example's ``precision: auto`` on a CPU with native bf16) against fp32, hetrun
   alone, same weights, batch and order: 1 - cosine of the first step's whole gradient, and the
   median per-tensor relative difference of the first step. Not an equality: bf16 rounds. The
   bounds only flag a broken bf16 path (session 21 measured cosine ~0.9996, median ~7%).

The fp32 tolerances sit about 10x above the rounding measured here, far below what a real
difference gives: SB3 built with its value coefficient not halved fails five checks (the
gradient off by up to 100% on a tensor, the step by 30%).

Runs in about 30 s on 2 cores (8 envs x 32 steps, 2 minibatches x 1 epoch, 500 env steps
for the stream check); the ALE ROMs ship with ale-py, nothing is downloaded. Exits 1 if a check
fails its tolerance.

    python3 benchmarks/atari_learner_match.py [--json OUT]
    flock /var/lock/hetrun-heavy.lock python3 benchmarks/atari_learner_match.py \
        --json benchmarks/results/atari_learner_match_s21.json      # as recorded in atari.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import stable_baselines3
import torch
import yaml
from hetrun.examples.atari_envs import AtariSettings, AtariVector, make_atari_env, num_actions
from hetrun.examples.atari_ppo import AtariPPOWorkload, ImpalaEncoder
from hetrun.examples.learner_precision import cpu_has_native_bf16, resolve
from hetrun.runtime.context import RankContext
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_ppo_throughput import ENV_ID, hyper

REPO = Path(__file__).resolve().parents[1]
MINIBATCHES, EPOCHS = 2, 1  # Adam steps of the compared update: MINIBATCHES x EPOCHS
MAX_ROLLOUTS = 10  # rollouts tried for a batch with a lost life and a reward
# hetrun parameter name prefix -> SB3's (the agent's encoder and heads; SB3 shares its extractor).
SB3_NAMES = {"encoder.": "features_extractor.encoder.", "policy.": "action_net.", "value.": "value_net."}


# ---------------------------------------------------------------- the table


@dataclass
class Check:
    name: str
    values: list[float]  # the measured differences (per step, tensor, sample, ...)
    stat: str  # "max" or "median": what the tolerance bounds
    tolerance: float

    @property
    def measured(self) -> float:
        return float(np.max(self.values) if self.stat == "max" else np.median(self.values))

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.measured) and self.measured <= self.tolerance)

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "n": len(self.values), "max": float(np.max(self.values)),
                "median": float(np.median(self.values)), "measured": self.measured, "passed": self.passed,
                "values": None if len(self.values) > 64 else self.values}


def table(checks: list[Check]) -> str:
    lines = ["| check | n | max | median | tolerance | result |", "|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c.name} | {len(c.values)} | {np.max(c.values):.3g} | {np.median(c.values):.3g} | "
                     f"{c.stat} <= {c.tolerance:g} | {'pass' if c.passed else '**FAIL**'} |")
    return "\n".join(lines)


def relative(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """|a - b| / |scale| (default |b|), Frobenius norms."""
    ref = float((b if scale is None else scale).norm())
    return float((a - b).norm()) / max(ref, 1e-30)


# ---------------------------------------------------------------- 1. env streams


def check_env_streams(settings: AtariSettings, n_envs: int, steps: int, seed: int) -> list[Check]:
    """hetrun's AtariVector against SB3's DummyVecEnv + VecMonitor (as sb3_worker builds it)."""
    ours = AtariVector(settings, n_envs, seed)
    peer = DummyVecEnv([lambda: make_atari_env(settings) for _ in range(n_envs)])
    peer.seed(seed)  # env i reset with seed + i, as AtariVector does
    peer = VecMonitor(peer)
    obs_d = [int(np.abs(ours.obs.astype(np.int16) - peer.reset()).max())]
    reward_d, done_d, lost = [], [], 0
    rng = np.random.default_rng(seed)
    n = num_actions(settings)
    for _ in range(steps):
        actions = rng.integers(n, size=n_envs)
        o1, r1, d1 = ours.step(actions)
        o2, r2, d2, _ = peer.step(actions)
        obs_d.append(int(np.abs(o1.astype(np.int16) - o2).max()))
        reward_d.append(float(np.abs(r1 - r2).max()))
        done_d.append(float(np.abs(d1.astype(np.float32) - d2).max()))
        lost += int(d1.sum())
    ours_scores = ours.pop_finished()[0]
    peer_scores = [s for per_env in peer.env_method("pop_game_scores") for s in per_env]
    ours.close()
    peer.close()
    # No finished game, or not as many on both sides: the check fails (inf), it is not vacuous.
    comparable = bool(ours_scores) and len(ours_scores) == len(peer_scores)
    score_d = [abs(a - b) for a, b in zip(ours_scores, peer_scores, strict=True)] if comparable else [float("inf")]
    print(f"env streams: {steps} x {n_envs} steps, {lost} lost lives or game overs and "
          f"{len(ours_scores)} games finished on hetrun's side, "
          f"{len(peer_scores)} on SB3's (mean score {np.mean(ours_scores) if ours_scores else float('nan'):.1f})",
          flush=True)
    return [
        Check("env: observations, per step max abs diff (uint8 levels)", obs_d, "max", 0),
        Check("env: clipped rewards, per step max abs diff", reward_d, "max", 0),
        Check("env: dones (lost life or game over), per step max abs diff", done_d, "max", 0),
        Check("env: finished games' real scores, abs diff per game", score_d, "max", 0),
    ]


# ---------------------------------------------------------------- 2./3. the learner


class ImpalaExtractor(BaseFeaturesExtractor):
    """The example's encoder as SB3's features extractor (atari_ppo_throughput.sb3_worker's)."""

    def __init__(self, observation_space: Any, width: int, hidden: int) -> None:
        super().__init__(observation_space, features_dim=hidden)
        self.encoder = ImpalaEncoder(tuple(observation_space.shape), width, hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(obs)  # SB3 hands float frames (normalize_images off): /255 inside


def sb3_model(h: dict[str, Any], settings: AtariSettings, seed: int) -> PPO:
    """SB3's PPO with the arguments atari_ppo_throughput.sb3_worker gives it."""
    envs = DummyVecEnv([lambda: make_atari_env(settings) for _ in range(h["num_envs"])])
    batch = h["num_envs"] * h["num_steps"]
    model = PPO("CnnPolicy", envs, n_steps=h["num_steps"], batch_size=batch // h["num_minibatches"],
                n_epochs=h["update_epochs"], learning_rate=h["learning_rate"], gamma=h["gamma"],
                gae_lambda=h["gae_lambda"], clip_range=h["clip_coef"], ent_coef=h["ent_coef"],
                vf_coef=0.5 * h["vf_coef"],  # SB3's value loss is the MSE, hetrun's 0.5 x MSE
                max_grad_norm=h["max_grad_norm"], normalize_advantage=True,
                policy_kwargs={"features_extractor_class": ImpalaExtractor, "normalize_images": False,
                               "features_extractor_kwargs": {"width": h["impala_width"], "hidden": h["hidden"]},
                               "net_arch": [], "share_features_extractor": True},
                seed=seed, device="cpu", verbose=0)
    model.set_logger(configure(None, []))  # train() logs its losses: kept in memory, printed nowhere
    return model


def sb3_params(model: PPO, learner: AtariPPOWorkload) -> list[torch.Tensor]:
    """SB3's parameters in the order of the hetrun agent's, checked to be the same set."""
    theirs = dict(model.policy.named_parameters())
    out = []
    for name, p in learner.agent.named_parameters():
        prefix = next(k for k in SB3_NAMES if name.startswith(k))
        q = theirs.pop(SB3_NAMES[prefix] + name.removeprefix(prefix))
        assert q.shape == p.shape, name
        out.append(q)
    assert not theirs, f"SB3 parameters with no hetrun counterpart: {sorted(theirs)}"
    return out


def fill_rollout_buffer(model: PPO, batch: dict[str, torch.Tensor]) -> None:
    """hetrun's env-major batch [N, T] into SB3's time-major buffer, then SB3's GAE."""
    buf = model.rollout_buffer
    buf.reset()

    def time_major(x: torch.Tensor) -> np.ndarray:
        return x.transpose(0, 1).numpy()

    dones = time_major(batch["dones"])
    buf.observations[:] = time_major(batch["obs"])
    buf.actions[:] = time_major(batch["actions"])[..., None]
    buf.rewards[:] = time_major(batch["rewards"])
    buf.episode_starts[0] = 1.0  # not read by GAE; the batch's first step
    buf.episode_starts[1:] = dones[:-1]  # SB3's collect_rollouts: episode_starts[t] = dones[t - 1]
    buf.values[:] = time_major(batch["values"])
    buf.log_probs[:] = time_major(batch["logprobs"])
    buf.pos, buf.full = buf.buffer_size, True
    buf.compute_returns_and_advantage(batch["last_values"], dones[-1])


class StepRecorder:
    """What each optimizer step applies: the gradients (after the norm clip) and the weights after it."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        self.start = [p.detach().clone() for p in params]
        self.grads: list[list[torch.Tensor]] = []
        self.weights: list[list[torch.Tensor]] = []
        optimizer.register_step_pre_hook(
            lambda *_: self.grads.append([p.grad.detach().clone() for p in params]))
        optimizer.register_step_post_hook(
            lambda *_: self.weights.append([p.detach().clone() for p in params]))

    def step_of(self, k: int) -> list[torch.Tensor]:
        return [w - w0 for w, w0 in zip(self.weights[k], self.start, strict=True)]


def follow_order(learner: AtariPPOWorkload, minibatches: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Run ``learner``'s next update over ``minibatches`` in that order (its own draw replaced);
    returns the dict its GAE results land in once the update has prepared the batch."""
    prepare, seen = learner._prepare, {}

    def prepare_in_order(batch: dict[str, torch.Tensor]) -> None:
        prepare(batch)
        learner._schedule = [torch.as_tensor(mb) for mb in minibatches]
        seen.update({k: learner._prepared[k].clone() for k in ("advantages", "returns")})

    learner._prepare = prepare_in_order
    return seen


def hetrun_update(learner: AtariPPOWorkload, batch: dict[str, torch.Tensor], micro: int) -> dict[str, float]:
    """One PPO update as the runtime runs it: the first step's micro-batches, then optimize."""
    for m in range(micro):
        learner.backward(learner.forward(batch, m, micro))
    return learner.optimize()


def per_tensor(a: Iterable[torch.Tensor], b: Iterable[torch.Tensor],
               scale: Iterable[torch.Tensor] | None = None) -> list[float]:
    if scale is None:
        return [relative(x, y) for x, y in zip(a, b, strict=True)]
    return [relative(x, y, s) for x, y, s in zip(a, b, scale, strict=True)]


def check_learners(h: dict[str, Any], settings: AtariSettings, seed: int, micro: int,
                   run_dir: Path) -> list[Check]:
    def workload(rank: int, component: str, precision: str) -> AtariPPOWorkload:
        ctx = RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1, group=None,
                          comm=None, device="cpu", seed=seed, run_dir=run_dir, mode="inprocess")
        return AtariPPOWorkload(ctx, **{**h, "precision": precision})

    learner, roller = workload(0, "learner", "32"), workload(1, "rollout", "32")
    roller.load_policy(learner.policy_state(), 0)
    # The first batch with a lost life and a reward in it (so GAE cuts and credits something).
    batch, rollouts = roller.rollout(0), 1
    while not (batch["dones"].any() and batch["rewards"].any()):
        if rollouts == MAX_ROLLOUTS:
            raise SystemExit(f"no batch with a lost life and a reward in {MAX_ROLLOUTS} rollouts: raise --steps")
        batch, rollouts = roller.rollout(0), rollouts + 1
    print(f"batch: rollout {rollouts}, {h['num_envs']} x {h['num_steps']} steps, "
          f"{int(batch['dones'].sum())} dones, {int((batch['rewards'] != 0).sum())} rewards", flush=True)

    model = sb3_model(h, settings, seed)
    pol, ours = model.policy, learner.parameters_to_sync()
    theirs = sb3_params(model, learner)
    with torch.no_grad():
        for q, p in zip(theirs, ours, strict=True):
            q.copy_(p)

    # Behaviour values and log-probs, one time step at a time as both rollouts compute them.
    pol.set_training_mode(False)
    value_d, logp_d = [], []
    with torch.no_grad():
        for t in range(h["num_steps"]):
            v, logp, _ = pol.evaluate_actions(batch["obs"][:, t], batch["actions"][:, t])
            value_d.append(float((v.squeeze(-1) - batch["values"][:, t]).abs().max()))
            logp_d.append(float((logp - batch["logprobs"][:, t]).abs().max()))

    # SB3's minibatch order, drawn as its train() draws it; hetrun's update follows it.
    size = h["num_envs"] * h["num_steps"]
    np.random.seed(seed)
    order = [mb for _ in range(h["update_epochs"])
             for mb in np.split(np.random.permutation(size), h["num_minibatches"])]
    fill_rollout_buffer(model, batch)
    buf = model.rollout_buffer
    adv_sb3 = torch.as_tensor(buf.advantages.swapaxes(0, 1).reshape(-1))  # env-major, as hetrun's
    ret_sb3 = torch.as_tensor(buf.returns.swapaxes(0, 1).reshape(-1))
    used, get_samples = [], buf._get_samples

    def recording(inds: np.ndarray, env: Any = None) -> Any:  # the minibatches SB3's train() takes
        used.append(inds.copy())
        return get_samples(inds, env)

    buf._get_samples = recording

    # The bf16-mixed learner starts from the same weights (before the fp32 one updates).
    learner16 = workload(0, "learner", "bf16-mixed")
    learner16.agent.load_state_dict(learner.agent.state_dict())

    rec_ours = StepRecorder(learner.optimizer, ours)
    rec_sb3 = StepRecorder(pol.optimizer, theirs)
    rec16 = StepRecorder(learner16.optimizer, learner16.parameters_to_sync())
    gae = follow_order(learner, order)
    follow_order(learner16, order)
    metrics = hetrun_update(learner, batch, micro)
    hetrun_update(learner16, batch, micro)
    np.random.seed(seed)
    model.train()
    assert len(used) == len(order) and all(np.array_equal(a, b) for a, b in zip(used, order, strict=True)), \
        "SB3's minibatches are not the order drawn for hetrun"
    logged = model.logger.name_to_value
    losses = [relative(torch.tensor(2 * metrics["v_loss"]), torch.tensor(logged["train/value_loss"])),
              relative(torch.tensor(metrics["entropy"]), torch.tensor(-logged["train/entropy_loss"]))]

    steps = len(order)
    checks = [
        Check("behaviour values: SB3 evaluate_actions vs the rollout's, max abs diff per step", value_d,
              "max", 1e-5),
        Check("behaviour log-probs: the same, max abs diff per step", logp_d, "max", 1e-5),
        Check("GAE advantages: SB3 compute_returns_and_advantage vs hetrun, abs diff per sample",
              (gae["advantages"] - adv_sb3).abs().tolist(), "max", 1e-6),
        Check("GAE returns: the same, abs diff per sample", (gae["returns"] - ret_sb3).abs().tolist(), "max", 1e-6),
        Check("step 1 gradient (clipped), rel diff per tensor", per_tensor(rec_ours.grads[0], rec_sb3.grads[0]),
              "max", 1e-4),
        Check("weights after Adam step 1, norm(w_h - w_sb3) / norm(step_sb3) per tensor",
              per_tensor(rec_ours.weights[0], rec_sb3.weights[0], rec_sb3.step_of(0)), "max", 1e-4),
        *(Check(f"weights after Adam step {k + 1} (rounding that Adam amplifies), the same",
                per_tensor(rec_ours.weights[k], rec_sb3.weights[k], rec_sb3.step_of(k)), "max", 1e-3)
          for k in range(1, steps)),
        Check("update's value loss (SB3 = 2 x hetrun's) and entropy, rel diff", losses, "max", 1e-5),
    ]
    g32 = torch.cat([g.flatten() for g in rec_ours.grads[0]])
    g16 = torch.cat([g.flatten() for g in rec16.grads[0]])
    cos = float(torch.nn.functional.cosine_similarity(g32, g16, 0))
    checks += [
        Check("bf16-mixed vs fp32 (hetrun): 1 - cos of step 1's whole gradient", [1 - cos], "max", 1e-2),
        Check("bf16-mixed vs fp32 (hetrun): step 1, norm(step_bf16 - step_fp32) / norm(step_fp32) per tensor",
              per_tensor(rec16.step_of(0), rec_ours.step_of(0)), "median", 0.25),
    ]
    return checks


# ---------------------------------------------------------------- main


def timed(label: str, fn: Callable[[], list[Check]], spent: dict[str, float]) -> list[Check]:
    t0 = time.perf_counter()
    out = fn()
    spent[label] = round(time.perf_counter() - t0, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=8, help="games per side (and the batch's envs)")
    ap.add_argument("--steps", type=int, default=32, help="the compared batch's rollout length")
    ap.add_argument("--env-steps", type=int, default=500, help="agent steps per env in the stream check")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    started, load = time.perf_counter(), " ".join(Path("/proc/loadavg").read_text().split()[:3])
    h = {**hyper(argparse.Namespace(learner_threads=None, envs=args.envs, width=16, hidden=256)),
         "num_steps": args.steps, "num_minibatches": MINIBATCHES, "update_epochs": EPOCHS}
    micro = yaml.safe_load((REPO / "examples" / "ppo_atari.yaml").read_text())["training"]["micro_batches"]
    settings = AtariSettings(env_id=ENV_ID)
    auto = resolve("auto", torch.device("cpu"))
    print(f"{ENV_ID}; stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__}; "
          f"precision auto here: {auto} (native bf16: {cpu_has_native_bf16()}); load {load}", flush=True)
    spent: dict[str, float] = {}
    checks = timed("env_streams_s", lambda: check_env_streams(settings, args.envs, args.env_steps, args.seed), spent)
    with tempfile.TemporaryDirectory() as run_dir:
        checks += timed("learners_s", lambda: check_learners(h, settings, args.seed, micro, Path(run_dir)), spent)
    elapsed = time.perf_counter() - started
    print(table(checks))
    failed = [c.name for c in checks if not c.passed]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks pass; {elapsed:.0f} s ({spent})")
    if args.json:
        args.json.write_text(json.dumps({
            "argv": sys.argv[1:], "env_id": ENV_ID, "hyper": h, "micro_batches": micro, "seed": args.seed,
            "env_steps_per_env": args.env_steps,
            "precision_auto": auto, "versions": {"sb3": stable_baselines3.__version__, "torch": torch.__version__},
            "load_before": load, "load_after": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
            "elapsed_s": round(elapsed, 1), "phases_s": spent, "all_passed": not failed,
            "checks": [c.row() for c in checks]}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

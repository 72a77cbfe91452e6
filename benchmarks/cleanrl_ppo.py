"""A CleanRL-style single-file PPO: the peer hetrun's PPO benchmarks run beside their own jobs.

It follows CleanRL's ``ppo.py`` (CartPole) and ``ppo_atari.py`` /
``ppo_atari_envpool.py`` (Atari) line for line where it matters for speed: one
process, a vector env, a fixed-size rollout buffer, GAE, then ``update_epochs``
x ``num_minibatches`` Adam steps on the clipped PPO loss; no learning-rate
annealing (hetrun's examples keep it constant). What is hetrun's is only what
makes the comparison the same work: the network (CartPole: the 64x64 tanh
actor and critic of examples/ppo.py; Atari: the IMPALA agent of
examples/atari_ppo.py), the hyper-parameters (passed in by the benchmark
scripts), the Atari wrappers (examples/atari_envs.py, CleanRL's own stack) and
the CartPole evaluation protocol (20 sampled-action episodes seeded by (seed,
1, version), examples/ppo.py's).

Vector envs (``--vec``): ``sync`` (gymnasium SyncVectorEnv, CleanRL's
default), ``async`` (gymnasium AsyncVectorEnv: one process per env, what the
issue asked for on 2 cores), ``envpool`` (C++ threads; CleanRL's
``*_envpool.py`` variants). ``--threads``: torch intra-op threads.

Prints one JSON line: steady env steps/s (benchmarks/ppo_pipeline.py's
steady_state over the update end times), whole-run env steps/s, CPU time of
the process and its children over 2 cores, time to the fixed return.

    python benchmarks/cleanrl_ppo.py --family cartpole --vec sync --updates 40
    python benchmarks/cleanrl_ppo.py --family atari --vec envpool --threads 2 --updates 4
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_pipeline import steady_state, warmup_updates

# ------------------------------------------------------------------ envs


def cartpole_envs(vec: str, n: int, seed: int) -> Any:
    import gymnasium as gym

    if vec == "envpool":
        import envpool

        return envpool.make("CartPole-v1", env_type="gymnasium", num_envs=n, seed=seed, num_threads=1)
    # SAME_STEP autoreset: the semantics of the gym versions CleanRL's scripts were written for.
    cls = gym.vector.SyncVectorEnv if vec == "sync" else gym.vector.AsyncVectorEnv
    return cls([lambda: gym.make("CartPole-v1") for _ in range(n)],
               autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def atari_envs(vec: str, n: int, seed: int, env_id: str) -> Any:
    import gymnasium as gym
    from hetrun.examples.atari_envs import AtariSettings, make_atari_env

    if vec == "envpool":
        import envpool

        # CleanRL's ppo_atari_envpool.py settings, sticky actions off as in examples/atari_envs.py.
        return envpool.make(env_id.removeprefix("ALE/"), env_type="gymnasium", num_envs=n, seed=seed,
                            episodic_life=True, reward_clip=True, repeat_action_probability=0.0,
                            noop_max=30, num_threads=1)
    settings = AtariSettings(env_id=env_id)
    cls = gym.vector.SyncVectorEnv if vec == "sync" else gym.vector.AsyncVectorEnv
    return cls([lambda: make_atari_env(settings) for _ in range(n)],
               autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


# ------------------------------------------------------------------ networks


def cartpole_agent(obs_dim: int, n_actions: int, hidden: int, seed: int) -> tuple[nn.Module, nn.Module]:
    from hetrun.examples.ppo import _mlp

    gen = torch.Generator().manual_seed(seed)
    return _mlp(obs_dim, hidden, n_actions, 0.01, gen), _mlp(obs_dim, hidden, 1, 1.0, gen)


def atari_agent(n_actions: int, width: int, hidden: int, seed: int) -> Any:
    from hetrun.examples.atari_ppo import ImpalaAgent

    return ImpalaAgent((4, 84, 84), width, hidden, n_actions, torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ evaluation (CartPole)


@torch.inference_mode()  # as examples/ppo.py evaluates
def evaluate_cartpole(actor: nn.Module, seed: int, version: int, episodes: int) -> float:
    """examples/ppo.py's protocol: ``episodes`` sampled-action episodes seeded by (seed, 1, version),
    through the example's own evaluation code (the same cost per evaluation as hetrun's)."""
    from hetrun.examples.ppo import eval_actions
    from hetrun.examples.ppo_envs import first_episode_returns, make_eval_env

    eval_seed = int(np.random.SeedSequence([seed, 1, version]).generate_state(1)[0])
    gen = torch.Generator().manual_seed(eval_seed)
    envs, obs = make_eval_env("CartPole-v1", episodes, eval_seed % (2**31 - episodes))
    try:
        return float(first_episode_returns(envs, obs, eval_actions(actor, gen)).mean())
    finally:
        envs.close()


# ------------------------------------------------------------------ PPO


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    h = json.loads(args.hyper)
    n, t_len = h["num_envs"], h["num_steps"]
    batch = n * t_len
    mb_size = batch // h["num_minibatches"]
    atari = args.family == "atari"
    if atari:
        envs = atari_envs(args.vec, n, args.seed, h["env_id"])
        agent = atari_agent(int(envs.single_action_space.n), h["impala_width"], h["hidden"], args.seed)
        params = list(agent.parameters())

        def heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f = agent.features(x)
            return agent.policy(f), agent.value(f).squeeze(-1)

        obs_buf = torch.zeros((t_len, n, 4, 84, 84), dtype=torch.uint8)
    else:
        envs = cartpole_envs(args.vec, n, args.seed)
        actor, critic = cartpole_agent(4, 2, h["hidden"], args.seed)
        params = [*actor.parameters(), *critic.parameters()]

        def heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return actor(x), critic(x).squeeze(-1)

        obs_buf = torch.zeros((t_len, n, 4))
    optimizer = torch.optim.Adam(params, lr=h["learning_rate"], eps=1e-5)
    actions_buf = torch.zeros((t_len, n), dtype=torch.int64)
    logp_buf = torch.zeros((t_len, n))
    rew_buf = torch.zeros((t_len, n))
    done_buf = torch.zeros((t_len, n))
    val_buf = torch.zeros((t_len, n))

    if args.vec == "envpool":
        next_obs, _ = envs.reset()
    else:
        next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs) if atari else torch.as_tensor(next_obs, dtype=torch.float32)
    next_done = torch.zeros(n)
    # Atari through gymnasium: the real game scores come from the GameScore wrappers, which only
    # a SyncVectorEnv exposes (AsyncVectorEnv runs: no time to the fixed return).
    trackers = []
    if atari and args.vec == "sync":
        from hetrun.examples.atari_envs import _score_of

        trackers = [_score_of(e) for e in envs.envs]
    scores = np.zeros(n)
    recent: deque[float] = deque(maxlen=20)
    log: dict[str, Any] = {"eval_returns": [], "solved_at_s": None, "solved_version": None}
    ends: dict[int, float] = {}
    started = time.time()
    cpu0 = time.process_time()
    for update in range(args.updates):
        # ---------------------------------------------------------- rollout
        for t in range(t_len):
            obs_buf[t] = next_obs
            done_buf[t] = next_done
            with torch.no_grad():
                logits, value = heads(next_obs)
                probs = torch.distributions.Categorical(logits=logits)
                action = probs.sample()
                logp_buf[t] = probs.log_prob(action)
            val_buf[t] = value
            actions_buf[t] = action
            o, r, term, trunc, info = envs.step(action.numpy().astype(np.int32 if args.vec == "envpool"
                                                                       else np.int64))
            done = np.logical_or(term, trunc)
            rew_buf[t] = torch.as_tensor(r, dtype=torch.float32)
            next_obs = torch.as_tensor(o) if atari else torch.as_tensor(o, dtype=torch.float32)
            next_done = torch.as_tensor(done, dtype=torch.float32)
            # Real returns (Atari: the game's score across lives, as CleanRL logs it).
            if atari and args.vec == "envpool":
                scores += info["reward"]
                over = np.logical_or(info["terminated"], trunc)
            elif atari:  # examples/atari_envs.py's GameScore trackers (SyncVectorEnv only)
                over = np.zeros(n, dtype=bool)
                for tracker in trackers:
                    recent.extend(score for score, _ in tracker.finished)
                    tracker.finished.clear()
            else:
                scores += r
                over = done
            for i in np.flatnonzero(over):
                recent.append(float(scores[i]))
            scores[over] = 0.0
        # ---------------------------------------------------------- GAE
        with torch.no_grad():
            _, next_value = heads(next_obs)
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(n)
            for t in reversed(range(t_len)):
                if t == t_len - 1:
                    nonterminal, nv = 1.0 - next_done, next_value
                else:
                    nonterminal, nv = 1.0 - done_buf[t + 1], val_buf[t + 1]
                delta = rew_buf[t] + h["gamma"] * nv * nonterminal - val_buf[t]
                last = delta + h["gamma"] * h["gae_lambda"] * nonterminal * last
                adv[t] = last
            ret = adv + val_buf
        b_obs = obs_buf.reshape((batch, *obs_buf.shape[2:]))
        b_act, b_logp = actions_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
        # ---------------------------------------------------------- update
        for _ in range(h["update_epochs"]):
            perm = torch.randperm(batch)
            for start in range(0, batch, mb_size):
                mb = perm[start:start + mb_size]
                logits, new_value = heads(b_obs[mb])
                dist = torch.distributions.Categorical(logits=logits)
                new_logp = dist.log_prob(b_act[mb])
                log_ratio = new_logp - b_logp[mb]
                ratio = log_ratio.exp()
                mb_adv = b_adv[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - h["clip_coef"], 1 + h["clip_coef"]))
                v_loss = 0.5 * (new_value - b_ret[mb]).pow(2).mean()
                loss = pg.mean() - h["ent_coef"] * dist.entropy().mean() + h["vf_coef"] * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, h["max_grad_norm"])
                optimizer.step()
        ends[update] = time.time()
        version = update + 1
        # ---------------------------------------------------------- the fixed return
        if atari:
            if (log["solved_at_s"] is None and len(recent) >= 5
                    and float(np.mean(recent)) >= args.target_return):
                log["solved_at_s"], log["solved_version"] = time.time() - started, version
            if args.stop_at_target and log["solved_at_s"] is not None:
                break
        elif args.eval_interval and (version % args.eval_interval == 0 or version == args.updates):
            got = evaluate_cartpole(actor, args.seed, version, h["eval_episodes"])
            log["eval_returns"].append(round(got, 1))
            if got >= args.target_return and log["solved_at_s"] is None:
                log["solved_at_s"], log["solved_version"] = time.time() - started, version
    span = time.time() - started
    envs.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + children.ru_utime + children.ru_stime
    steps = len(ends) * batch  # every update run (fewer than --updates after --stop-at-target)
    log.update(started_wall=started, env_steps=steps, span_s=span, steps_per_s=steps / span,
               actions=None, actions_per_s=None,
               busy={"process": cpu / (2 * span)}, mean_staleness=0.0,
               training_return=float(np.mean(recent)) if recent else None,
               **steady_state(ends, started, batch, warmup_updates(args.updates)))
    return log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["cartpole", "atari"], required=True)
    ap.add_argument("--vec", choices=["sync", "async", "envpool"], default="sync")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-interval", type=int, default=0, help="CartPole: evaluate every K updates")
    ap.add_argument("--target-return", type=float, default=475.0,
                    help="CartPole: mean evaluation return; Atari: mean of the last 20 games' scores")
    ap.add_argument("--stop-at-target", action="store_true", help="Atari: end once the return is reached")
    ap.add_argument("--hyper", required=True, help="the hyper-parameters as JSON (the benchmark's)")
    args = ap.parse_args()
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()


"""A CleanRL-style PPO script of your own, resumed exactly through the run API.

Not a hetrun workload: a plain script (python, srun, mpirun) that calls
``hetrun.attach()`` for checkpoints and the agreed stop. What it saves is what
a resumed run needs to equal an uninterrupted one (docs/PREEMPTION.md, "Exact
resume for your own RL script"): the networks and optimizer, the
environments (``VectorEnvState``: physics, time-limit counters, RNGs, pending
autoresets), and the loop's own values (``LoopState``: the observation carried
into the next step, each env's running return, the finished returns, the
update counter). The global RNGs (torch's sampling and shuffles here) are
saved by the run API itself.

    python -m hetrun.examples.ppo_own_script --run-dir runs/own --updates 8
    python -m hetrun.examples.ppo_own_script --run-dir runs/own --updates 8 --stop-after 3   # then again
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from hetrun.runtime.api import attach
from hetrun.runtime.api.gym_state import LoopState, VectorEnvState
from torch import nn


def mlp(n_in: int, n_out: int, hidden: int, gain: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                        nn.Linear(hidden, n_out))
    for i, layer in enumerate(m for m in net if isinstance(m, nn.Linear)):
        nn.init.orthogonal_(layer.weight, gain if i == 2 else np.sqrt(2))
        nn.init.zeros_(layer.bias)
    return net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--num-steps", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stop-after", type=int, default=0, help="save and stop after this many updates "
                    "(as after an agreed stop); 0: run to the end")
    ap.add_argument("--out", type=Path, default=None, help="write the final weights and the log here")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    n, t_len = args.num_envs, args.num_steps
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    actor, critic = mlp(4, 2, args.hidden, 0.01), mlp(4, 1, args.hidden, 1.0)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=2.5e-3, eps=1e-5)
    obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(obs, dtype=torch.float32)
    next_done = torch.zeros(n)
    ep_return = np.zeros(n)
    finished: list[float] = []
    log: list[dict[str, float]] = []

    run = attach(run_dir=args.run_dir, name="own-ppo")
    state = {"actor": actor, "critic": critic, "optim": optimizer, "envs": VectorEnvState(envs),
             "loop": LoopState(next_obs=next_obs, next_done=next_done, ep_return=ep_return,
                               finished=finished, log=log)}
    start = run.restore(state)  # 0 on a fresh run; else the first update not yet done
    for update in range(start, args.updates):
        obs_b, act_b, logp_b, rew_b, done_b, val_b = ([] for _ in range(6))
        for _ in range(t_len):
            with torch.no_grad():
                dist = torch.distributions.Categorical(logits=actor(next_obs))
                action = dist.sample()
                obs_b.append(next_obs.clone())
                act_b.append(action)
                logp_b.append(dist.log_prob(action))
                val_b.append(critic(next_obs).squeeze(-1))
                done_b.append(next_done.clone())
            o, r, term, trunc, _ = envs.step(action.numpy())
            done = np.logical_or(term, trunc)
            ep_return += r
            finished.extend(float(x) for x in ep_return[done])
            ep_return[done] = 0.0
            rew_b.append(torch.as_tensor(r, dtype=torch.float32))
            next_obs.copy_(torch.as_tensor(o, dtype=torch.float32))  # in place: LoopState holds it
            next_done.copy_(torch.as_tensor(done, dtype=torch.float32))
        with torch.no_grad():  # GAE
            values = torch.stack(val_b)
            next_value = critic(next_obs).squeeze(-1)
            adv, last = torch.zeros(t_len, n), torch.zeros(n)
            for t in reversed(range(t_len)):
                nonterminal = 1.0 - (next_done if t == t_len - 1 else done_b[t + 1])
                nv = next_value if t == t_len - 1 else values[t + 1]
                last = rew_b[t] + 0.99 * nv * nonterminal - values[t] + 0.99 * 0.95 * nonterminal * last
                adv[t] = last
            returns = adv + values
        b_obs, b_act, b_logp = torch.stack(obs_b).reshape(-1, 4), torch.stack(act_b).reshape(-1), \
            torch.stack(logp_b).reshape(-1)
        b_adv, b_ret = adv.reshape(-1), returns.reshape(-1)
        for _ in range(2):
            for mb in torch.randperm(n * t_len).tensor_split(2):
                dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
                ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
                a = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2)).mean()
                loss = pg + 0.25 * (critic(b_obs[mb]).squeeze(-1) - b_ret[mb]).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                optimizer.step()
        log.append({"update": float(update), "loss": loss.item(),
                    "return": float(np.mean(finished[-10:])) if finished else 0.0})
        run.log(update, **log[-1])
        if run.should_stop(update) or update + 1 == args.stop_after:
            run.save(update, state, wait=True)
            run.close(0)
            return
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save({f"actor.{k}": v for k, v in actor.state_dict().items()}
                   | {f"critic.{k}": v for k, v in critic.state_dict().items()}, args.out / "weights.pt")
        (args.out / "log.json").write_text(json.dumps(log))
    run.close(0)


if __name__ == "__main__":
    main()

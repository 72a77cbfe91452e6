"""PPO on a gymnasium environment, as a hetrun workload.

Two components share this class: *rollout* ranks step vectorized environments
with the newest policy they have received (possibly a few versions old when the
plan's tolerance window allows it); *learner* ranks turn each batch into PPO
updates. Read top to bottom: configuration, networks, rollout, loss, update,
evaluation, checkpoint state. The algorithm follows CleanRL's ``ppo.py``:
clipped surrogate, GAE, value loss, entropy bonus, per-minibatch advantage
normalization, several minibatch epochs per batch.

Staleness: each batch carries the behaviour policy's log-probabilities and the
version that produced them. With ``staleness_correction: decoupled`` (the
default) a batch collected with weights older than the learner's uses the
decoupled PPO objective (Hilton, Cobbe & Schulman 2021, "Batch size-invariance
for policy optimization"): the trust region is centred on the learner's policy
at the start of the update (the *proximal* policy, one extra forward pass over
the stale samples), and the importance weight pi_prox/pi_behaviour corrects for
who collected the data. Plain PPO (``none``) clips pi_new/pi_behaviour instead:
the learner's policy has already moved away from the behaviour policy, so
part of the clip range is spent before the update starts and a pipelined run
learns less per sample (benchmarks/atari.md). A batch with no stale sample is
plain PPO either way, bit for bit. Values and advantages are recomputed on the
learner with its current critic, so stale critics never enter the targets.

Batch layout is *env-major* (``[envs, steps, ...]``): when the runtime
concatenates the batches of several rollout ranks along dim 0, the result is
still a valid set of per-environment trajectories.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from hetrun.runtime.context import RankContext
from hetrun.runtime.eager_optim import eager
from hetrun.runtime.workload import Workload
from torch import Tensor, nn
from torch.nn import functional as F

from hetrun.errors import CheckpointError

from . import learner_precision
from .cpu_share import CpuPhase, node_cpus, runnable_elsewhere
from .flat_params import FlatParams
from .ppo_args import PPOWorkloadArgs
from .ppo_envs import (
    capture_env_state,
    env_facts,
    first_episode_steps,
    make_eval_env,
    make_vector_env,
    restore_env_state,
)
from .ppo_spread_eval import SpreadEval, slice_steps, spread_gap

# ---------------------------------------------------------------- configuration


# ``workload_args`` are the typed model in ppo_args.py: `hetrun plan` checks them
# there without importing this module (hetrun.dag.workload_args).
PPOConfig = PPOWorkloadArgs
LEARNER_DEVICE = torch.device("cpu")  # the PPO examples train on CPU, learner and rollout alike


# ---------------------------------------------------------------- networks


FLAT_KEY = "params.flat"  # state_dict(): the actor's then the critic's parameters, one tensor
POLICY_FLAT_KEY = "actor.flat"  # policy_state(): the actor's parameters, one tensor


def _mlp(n_in: int, hidden: int, n_out: int, out_gain: float, gen: torch.Generator) -> nn.Sequential:
    """Tanh MLP with orthogonal init (CleanRL's layer_init), seeded by ``gen``."""
    layers = [nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
              nn.Linear(hidden, n_out)]
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        gain = out_gain if i == len(linears) - 1 else math.sqrt(2)
        nn.init.orthogonal_(lin.weight, gain, generator=gen)
        nn.init.zeros_(lin.bias)
    return nn.Sequential(*layers)


def eval_actions(actor: nn.Sequential, gen: torch.Generator,
                 deterministic: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """obs [n, D] -> actions [n] exactly as ``multinomial(softmax(actor(obs)), 1, generator=gen)``
    (or the argmax) would give them, without the per-call overhead.

    An evaluation is ~500 steps of a 20-row batch: torch's per-call overhead, not the
    arithmetic, is its cost. The layers run as the same functional ops (F.linear, tanh:
    identical results without the module call machinery), and ``multinomial(p, 1)`` as its
    own CPU algorithm, argmax(p / q) with q ~ Exp(1) drawn from ``gen`` (aten's
    Distributions.cpp for one sample), without its input checks: the same actions
    (tests/test_ppo_eval.py holds them to the originals).
    """
    ops: list[Callable[[Tensor], Tensor]] = []
    for layer in actor:
        if type(layer) is nn.Linear:
            # Detached views of the live weights: no autograd graph, no no_grad() per call.
            ops.append(lambda x, w=layer.weight.detach(), b=layer.bias.detach(): F.linear(x, w, b))
        elif type(layer) is nn.Tanh:
            ops.append(torch.tanh)
        else:
            ops.append(layer)

    noise: list[np.ndarray] = []  # Exp(1) draws for the coming steps, oldest first

    def act(obs: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))
        for op in ops:
            x = op(x)
        if deterministic:
            return x.argmax(-1).numpy()
        probs = torch.softmax(x, -1).numpy()
        if not noise:
            # 64 steps' draws in one call: CPU exponential_ fills a tensor serially from the
            # generator, so the values are those 64 one-step draws would give (checked in
            # tests/test_ppo_eval.py); only the generator's final state may differ, and it is
            # this evaluation's own.
            noise.extend(torch.empty(64, *probs.shape).exponential_(1, generator=gen).numpy())
        # IEEE division and first-index argmax: numpy's equal torch's, bit for bit.
        return (probs / noise.pop(0)).argmax(-1)

    return act


# ---------------------------------------------------------------- the workload


def env_major(x: Tensor) -> Tensor:
    """[steps, envs, ...] -> [envs, steps, ...]: a batch is cut by environment."""
    return x.transpose(0, 1).contiguous()


class PPOWorkload(Workload):
    """One instance per rank: ``PPOWorkload(ctx, **workload_args)``."""

    # This rank's phase file when learner_threads is auto (examples/cpu_share.py); built on first use.
    _cpu_phase: CpuPhase | None = None
    _update_thread_counts: list[int]  # threads of each step of the update in progress
    # eval_spread (ppo_spread_eval.py): the evaluation in flight, and the slice size for the
    # next one to start at the next rollout (None: nothing to spread). Class defaults: the
    # Atari workload shares rollout() without this __init__.
    _spread: SpreadEval | None = None
    _spread_slice: int | None = None
    _max_episode_steps: int | None = None
    _flat: FlatParams | None = None  # the networks' flat buffers (None: by name, the Atari workload)

    def __init__(self, ctx: RankContext, **workload_args: Any) -> None:
        super().__init__(ctx, **workload_args)
        self.cfg = cfg = PPOConfig.from_args(workload_args)
        torch.set_num_threads(cfg.torch_threads)
        self.obs_dim, self.n_actions, self.reward_threshold, self._max_episode_steps = env_facts(cfg.env_id)
        seed = int(ctx.seed)
        # Same seed on every rank: rollout and learner start from identical weights.
        init_gen = torch.Generator().manual_seed(seed)
        self.actor = _mlp(self.obs_dim, cfg.hidden, self.n_actions, 0.01, init_gen)
        self.critic = _mlp(self.obs_dim, cfg.hidden, 1, 1.0, init_gen)
        # Both networks' parameters over one buffer, their gradients over another: Adam steps one
        # tensor and a snapshot holds one (examples/flat_params.py; _flat_params below).
        self._flat: FlatParams | None = FlatParams((self.actor, self.critic))
        self._optimizer: torch.optim.Adam | None = None  # built on the learner's first use
        self._net_refs: tuple[Any, Any, list[tuple[str, Tensor]]] | None = None  # _net_tensors's list
        # Per-rank stream for action sampling and minibatch shuffles, kept in state_dict so a
        # resumed rank draws exactly what an uninterrupted one would.
        self.rank_seed = int(np.random.SeedSequence([seed, ctx.rank]).generate_state(1)[0])
        self.gen = torch.Generator().manual_seed(self.rank_seed)

        self.version = 0  # optimizer updates applied (learner) / policy version held (rollout)
        self.env_steps = 0  # env steps consumed (learner) / produced (rollout)
        self.recent_returns: deque[float] = deque(maxlen=20)
        self._envs: Any = None  # built on the first rollout: learners never step envs
        self._obs: Tensor | None = None
        # Running return/length of each env's current episode (numpy: cheap per-step updates).
        self._ep_return: np.ndarray | None = None
        self._ep_len: np.ndarray | None = None
        self._prepared: dict[str, Tensor] | None = None
        self._schedule: list[Tensor] = []
        self._stats: dict[str, list[float]] = {}
        self._threads_outside_update: int | None = None

    # ------------------------------------------------------------ rollout side

    def _rollout_envs(self) -> Any:
        if self._envs is None:
            n = self.cfg.num_envs
            self._envs, obs = make_vector_env(self.cfg.env_id, n, self.rank_seed % (2**31 - n))
            self._obs = torch.as_tensor(obs, dtype=torch.float32)
            self._ep_return = np.zeros(n, dtype=np.float64)
            self._ep_len = np.zeros(n, dtype=np.int64)
        return self._envs

    def policy_state(self) -> dict[str, Tensor]:
        """The actor's weights (copies: the runtime may ship them while we keep training): one
        tensor, its part of the flat buffer, where the networks are flat (the pipeline keeps the
        states it sent in every snapshot until their consumers are past them: one tensor each
        there, not six), else by name."""
        if self._flat is not None:
            return {POLICY_FLAT_KEY: self._flat_params().param.detach()[self._flat.span(0)].clone()}
        return {k: v.detach().clone() for k, v in self.actor.state_dict().items()}

    def load_policy(self, state: dict[str, Tensor], version: int) -> None:
        if POLICY_FLAT_KEY in state:
            if self._flat is None:
                raise ValueError(f"{POLICY_FLAT_KEY!r}: a flat policy for a workload that keeps its networks by name")
            with torch.no_grad():
                self._flat_params().param[self._flat.span(0)] = state[POLICY_FLAT_KEY]
        else:
            self.actor.load_state_dict(state)
        self.version = int(version)

    def rollout(self, policy_version: int) -> dict[str, Tensor]:
        """``collect``'s batch, this rank marked busy on its node meanwhile (learner_threads: auto),
        so that a learner there uses this rank's core only while it waits for weights."""
        phase = self._phase("rollout")
        if phase is not None:
            phase.mark(busy=True)
        try:
            batch = self.collect(policy_version)
            self._advance_spread_eval()
            return batch
        finally:
            if phase is not None:
                phase.mark(busy=False)

    @torch.no_grad()
    def collect(self, policy_version: int) -> dict[str, Tensor]:
        """Step ``num_envs`` envs ``num_steps`` times with the held policy; env-major tensors.

        Keys: obs [N,T,D], actions/logprobs/rewards/dones/truncated [N,T],
        trunc_obs [N,T,D] (the final observation where an episode was cut by the
        time limit, so the learner can bootstrap it), last_obs [N,D],
        policy_version [N], env_steps [1], episode_returns/episode_lengths [K].
        """
        envs = self._rollout_envs()
        n, t_len, d = self.cfg.num_envs, self.cfg.num_steps, self.obs_dim
        assert self._obs is not None and self._ep_return is not None and self._ep_len is not None
        obs = torch.empty(t_len, n, d)
        actions = torch.empty(t_len, n, dtype=torch.int64)
        logprobs = torch.empty(t_len, n)
        rewards = torch.empty(t_len, n)
        dones = torch.zeros(t_len, n)
        truncated = torch.zeros(t_len, n)
        trunc_obs = torch.zeros(t_len, n, d)
        finished_returns: list[float] = []
        finished_lengths: list[int] = []
        next_obs = self._obs
        for t in range(t_len):
            obs[t] = next_obs
            logp_all = torch.log_softmax(self.actor(next_obs), dim=-1)  # [N, A]
            action = torch.multinomial(logp_all.exp(), 1, generator=self.gen)  # [N, 1]
            actions[t] = action.squeeze(1)
            logprobs[t] = logp_all.gather(1, action).squeeze(1)
            o, r, term, trunc, info = envs.step(actions[t].numpy())
            rewards[t] = torch.as_tensor(r, dtype=torch.float32)
            done = np.logical_or(term, trunc)
            dones[t] = torch.as_tensor(done, dtype=torch.float32)
            cut = np.logical_and(trunc, np.logical_not(term))
            if cut.any():
                truncated[t] = torch.as_tensor(cut, dtype=torch.float32)
                for i in np.flatnonzero(cut):
                    trunc_obs[t, i] = torch.as_tensor(info["final_obs"][i], dtype=torch.float32)
            self._ep_return += r
            self._ep_len += 1
            if done.any():
                finished_returns.extend(self._ep_return[done].tolist())
                finished_lengths.extend(self._ep_len[done].tolist())
                self._ep_return[done] = 0.0
                self._ep_len[done] = 0
            next_obs = torch.as_tensor(o, dtype=torch.float32)
        self._obs = next_obs
        self.env_steps += n * t_len
        self.recent_returns.extend(finished_returns)

        return {
            "obs": env_major(obs),
            "actions": env_major(actions),
            "logprobs": env_major(logprobs),
            "rewards": env_major(rewards),
            "dones": env_major(dones),
            "truncated": env_major(truncated),
            "trunc_obs": env_major(trunc_obs),
            "last_obs": next_obs.clone(),
            "policy_version": torch.full((n,), int(policy_version), dtype=torch.int64),
            "env_steps": torch.tensor([n * t_len], dtype=torch.int64),
            "episode_returns": torch.tensor(finished_returns, dtype=torch.float32),
            "episode_lengths": torch.tensor(finished_lengths, dtype=torch.int64),
        }

    # ------------------------------------------------------------ cores per phase

    def _phase(self, role: str) -> CpuPhase | None:
        """This rank's phase file, only where ranks share a node as processes (not in-process)."""
        if self.cfg.learner_threads != "auto" or self.ctx.mode != "mpi":
            return None
        if self._cpu_phase is None:
            self._cpu_phase = CpuPhase(self.ctx.run_dir, self.ctx.node, role, self.ctx.rank)
        return self._cpu_phase

    def _update_threads(self) -> None:
        """The update's torch threads for its next step: learner_threads, or with auto the node's
        cores its rollout ranks leave idle right now (re-read before every minibatch step, as
        they start and stop stepping their games in the middle of an update)."""
        phase = self._phase("learner")
        if phase is None:
            want = self.cfg.threads_for_learner()
        else:
            cpus = node_cpus()
            # Other work on the host caps it too (examples/cpu_share.py's docstring says why).
            want = phase.update_threads(cpus, runnable_elsewhere(torch.get_num_threads(), cpus))
        if want != torch.get_num_threads():
            torch.set_num_threads(want)
        self._update_thread_counts.append(want)

    # ------------------------------------------------------------ learner side

    @torch.no_grad()
    def _prepare(self, batch: dict[str, Tensor]) -> None:
        """GAE (its values from ``_gae_values``), flatten, and draw the epochs' minibatch schedule."""
        cfg = self.cfg
        obs, dones = batch["obs"], batch["dones"]  # [N,T,(D)]
        values, rewards, next_value = self._gae_values(batch)
        n, t_len = rewards.shape
        advantages = torch.zeros(n, t_len)
        last_gae = torch.zeros(n)
        for t in reversed(range(t_len)):
            next_v = next_value if t == t_len - 1 else values[:, t + 1]
            nonterminal = 1.0 - dones[:, t]  # the episode continues after step t
            delta = rewards[:, t] + cfg.gamma * next_v * nonterminal - values[:, t]
            last_gae = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last_gae
            advantages[:, t] = last_gae
        returns = advantages + values
        self._prepared = {
            "obs": obs.reshape(n * t_len, -1),
            "actions": batch["actions"].reshape(-1),
            "logprobs": batch["logprobs"].reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1),
            "values": values.reshape(-1),
        }
        size = n * t_len
        staleness = (self.version - batch["policy_version"]).float()
        self._stats = {"staleness": [float(staleness.mean())], "episodes": [len(batch["episode_returns"])]}
        self._proximal(staleness.repeat_interleave(t_len) > 0)
        self._schedule = [
            mb
            for _ in range(cfg.update_epochs)
            for mb in torch.randperm(size, generator=self.gen).tensor_split(cfg.num_minibatches)
        ]
        self.env_steps += size
        self.recent_returns.extend(batch["episode_returns"].tolist())

    PROXIMAL_CHUNK = 256  # samples per forward pass of the proximal policy (bounds its activations)

    def _proximal(self, stale: Tensor) -> None:
        """The clip's centre and importance weight for each sample of the prepared batch.

        ``prox_logprobs``: log pi_prox(a|s), the learner's policy now (before this update's first
        step), for the ``stale`` samples; the behaviour policy's own for fresh ones, where the two
        are the same policy. ``weights``: pi_prox/pi_behaviour (1 for fresh samples). Under
        ``staleness_correction: none`` every sample counts as fresh: plain PPO.
        """
        b = self._prepared
        prox = b["logprobs"].clone()
        correct = self.cfg.staleness_correction == "decoupled" and bool(stale.any())
        if correct:
            rows = stale.nonzero().squeeze(1)
            with learner_precision.autocast(self._learner_precision, LEARNER_DEVICE):
                for chunk in rows.split(self.PROXIMAL_CHUNK):
                    logits = self.actor(b["obs"][chunk]).float()
                    logp = torch.log_softmax(logits, dim=-1)
                    prox[chunk] = logp.gather(1, b["actions"][chunk].unsqueeze(1)).squeeze(1)
        log_w = prox - b["logprobs"]  # exactly 0 for fresh samples
        b["prox_logprobs"], b["weights"] = prox, log_w.exp()
        if correct:
            # How far the policy moved between collecting and learning (k3 estimate of KL).
            moved, w = log_w[stale], b["weights"][stale]
            self._stats["behaviour_kl"] = [float(((w - 1) - moved).mean())]
            self._stats["weight_max"] = [float(w.max())]

    def _gae_values(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """GAE's inputs: values [N,T], rewards [N,T] (time-limit cuts bootstrapped), next value [N].

        Here from the learner's current critic; a subclass may take values its
        rollout ranks computed (examples/atari_ppo.py).
        """
        values = self.critic(batch["obs"]).squeeze(-1)  # [N, T]
        rewards = batch["rewards"]
        # An episode cut by the time limit did not end: bootstrap its last reward with V(s_final).
        if batch["truncated"].any():  # most batches cut no episode: skip a critic pass over trunc_obs
            cut_values = self.critic(batch["trunc_obs"]).squeeze(-1)
            rewards = rewards + self.cfg.gamma * batch["truncated"] * cut_values
        return values, rewards, self.critic(batch["last_obs"]).squeeze(-1)

    def _loss(self, minibatch: Tensor, part: Tensor) -> Tensor:
        """PPO loss over ``part`` (indices within ``minibatch``), scaled so parts sum to the mean."""
        cfg, b = self.cfg, self._prepared
        assert b is not None
        adv = b["advantages"][part]
        if cfg.norm_adv:
            mb_adv = b["advantages"][minibatch]
            adv = (adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
        obs = b["obs"][part]
        with learner_precision.autocast(self._learner_precision, LEARNER_DEVICE):
            logits, new_value = self.actor(obs), self.critic(obs).squeeze(-1)
        logits, new_value = logits.float(), new_value.float()  # the loss itself in fp32
        logp_all = torch.log_softmax(logits, dim=-1)
        new_logprob = logp_all.gather(1, b["actions"][part].unsqueeze(1)).squeeze(1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        # Against the proximal policy, weighted by pi_prox/pi_behaviour (_proximal); for a sample
        # collected by the learner's current weights that is plain PPO (weight exactly 1).
        log_ratio = new_logprob - b["prox_logprobs"][part]
        ratio = log_ratio.exp()
        pg_loss = b["weights"][part] * torch.max(
            -adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
        v_loss = 0.5 * (new_value - b["returns"][part]).pow(2)
        loss = (pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss).mean()
        with torch.no_grad():
            for key, value in (
                ("pg_loss", pg_loss.mean()),
                ("v_loss", v_loss.mean()),
                ("entropy", entropy.mean()),
                ("approx_kl", ((ratio - 1) - log_ratio).mean()),
                ("clipfrac", ((ratio - 1).abs() > cfg.clip_coef).float().mean()),
            ):
                self._stats.setdefault(key, []).append(float(value))
        return loss * (len(part) / len(minibatch))

    @functools.cached_property
    def _learner_precision(self) -> Literal["32", "bf16-mixed"]:
        """``precision`` with auto decided for this machine (examples/learner_precision.py)."""
        return learner_precision.resolve(self.cfg.precision, LEARNER_DEVICE)

    def _minibatch_backward(self, minibatch: Tensor) -> None:
        """One minibatch's gradients into the parameters' ``.grad`` (the Atari example sums them
        over parts computed on the cores its rollouts leave idle: examples/atari_ppo.py)."""
        self._loss(minibatch, minibatch).backward()

    def _first_minibatch_parts(self, num_micro: int) -> tuple[Tensor, list[Tensor]]:
        minibatch = self._schedule[0]
        return minibatch, list(torch.arange(len(minibatch)).tensor_split(num_micro))

    def forward(self, batch: dict[str, Tensor], micro: int, num_micro: int) -> Tensor:
        """Loss of micro-batch ``micro`` of the first minibatch of this batch's PPO update.

        The runtime schedules one forward/backward/sync/optimize step per
        iteration; PPO reuses a batch for ``update_epochs`` x ``num_minibatches``
        steps. The runtime's step is the first of them (split into its
        micro-batches); ``optimize`` applies it and runs the rest.
        """
        if micro == 0:
            # The update's phase runs with the learner's threads (learner_threads), put back at
            # the end of optimize(): a process that also evaluates or rolls out keeps its own.
            self._threads_outside_update = torch.get_num_threads()
            self._update_thread_counts = []
            self._update_threads()
            self._prepare(batch)
        minibatch, parts = self._first_minibatch_parts(num_micro)
        return self._loss(minibatch, minibatch[parts[micro]])

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def parameters_to_sync(self) -> list[Tensor]:
        return [*self.actor.parameters(), *self.critic.parameters()]

    def _average_grads_across_learners(self) -> None:
        """Data-parallel learners average gradients of the inner PPO steps themselves."""
        size = self.ctx.comp_size
        if size <= 1:
            return
        import torch.distributed as dist

        if self._flat is not None:  # every gradient in one buffer already: reduced in place
            grad = self._flat_params().param.grad
            dist.all_reduce(grad, group=self.ctx.group)
            grad /= size
            return
        grads = [p.grad for p in self.parameters_to_sync() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.ctx.group)
        flat /= size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _step(self) -> None:
        if self._flat is None:
            nn.utils.clip_grad_norm_(self.parameters_to_sync(), self.cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return
        flat = self._flat_params()
        nn.utils.clip_grad_norm_([flat.param], self.cfg.max_grad_norm)
        self.optimizer.step()
        flat.zero_grad()  # in place: the networks' .grad are views into the buffer

    def _flat_params(self) -> FlatParams:
        """The flat buffers under the networks, made again when a network was replaced (a new
        ``actor``: then the optimizer, whose moments were the old networks', is built anew)."""
        flat = self._flat
        assert flat is not None
        if not flat.covers((self.actor, self.critic)):
            flat = self._flat = FlatParams((self.actor, self.critic))
            self._optimizer = None
        return flat

    def optimize(self) -> dict[str, float]:
        """Apply the runtime's (already synced) step, then the remaining minibatch epochs."""
        if self._prepared is None:
            raise RuntimeError("optimize() before forward(): no batch to learn from")
        if self._flat is not None:
            # Once an update, not each of its steps (a walk over every parameter): a gradient set
            # to None outside (the runtime's sync, a caller) would leave the networks out of the
            # step, silently; inside the update only _step's in-place zeroing touches them.
            self._flat_params().check()
        self._step()
        for minibatch in self._schedule[1:]:
            self._update_threads()
            self._minibatch_backward(minibatch)
            self._average_grads_across_learners()
            self._step()
        self.version += 1
        b = self._prepared
        var_y = float(b["returns"].var())
        explained = float("nan") if var_y == 0 else 1 - float((b["returns"] - b["values"]).var()) / var_y
        metrics = {k: float(np.mean(v)) for k, v in self._stats.items()}
        metrics.update(
            policy_version=float(self.version),
            env_steps=float(self.env_steps),
            explained_variance=explained if math.isfinite(explained) else 0.0,
            # Mean torch threads of the update's steps: with learner_threads auto, how much of
            # the update ran on the cores its rollout ranks left idle.
            update_threads=float(np.mean(self._update_thread_counts)),
        )
        if self.recent_returns:
            metrics["episodic_return"] = float(np.mean(self.recent_returns))
        self._prepared, self._schedule = None, []
        if self._threads_outside_update is not None:
            torch.set_num_threads(self._threads_outside_update)
            self._threads_outside_update = None
        return metrics

    # ------------------------------------------------------------ evaluation

    @torch.inference_mode()  # no autograd bookkeeping at all: ~7% of an evaluation
    def evaluate(self) -> dict[str, float]:
        """Mean return of ``eval_episodes`` episodes, seeded by (seed, policy version).

        Its own generator: evaluating never shifts the training streams. With ``eval_spread``
        on a rank that also rolls out, the evaluation ran over the rollouts since the previous
        one and the next starts at the next rollout (ppo_spread_eval.py); ``policy_version``
        says which weights were evaluated.
        """
        pending, self._spread = self._spread, None
        evaluation = pending if pending is not None else self._evaluation()
        returns = evaluation.finish()
        self._spread_slice = None
        gap = spread_gap(self.ctx) if self.cfg.eval_spread and self._envs is not None else None
        if gap is not None:  # the next one spread over the `gap` rollouts until then (the rest at it)
            self._spread_slice = slice_steps(self._max_episode_steps, gap)
        threshold = self.reward_threshold
        out = {
            "eval_return_mean": float(returns.mean()),
            "eval_return_min": float(returns.min()),
            "eval_return_max": float(returns.max()),
            "eval_episodes": float(self.cfg.eval_episodes),
            "eval_deterministic": float(self.cfg.eval_deterministic),
            "policy_version": float(evaluation.version),
        }
        if threshold is not None:
            out["reward_threshold"] = float(threshold)
            out["solved"] = float(returns.mean() >= threshold)
        return out

    def _evaluation(self, slice_size: int = 1) -> SpreadEval:
        """An evaluation of the weights held now (a copy: the rank may load newer ones while it
        runs), on its own generator seeded by (seed, policy version)."""
        version, n = self.version, self.cfg.eval_episodes
        seed = int(np.random.SeedSequence([self.ctx.seed, 1, version]).generate_state(1)[0])
        envs, obs = make_eval_env(self.cfg.env_id, n, seed % (2**31 - n))
        act = eval_actions(copy.deepcopy(self.actor), torch.Generator().manual_seed(seed), self.cfg.eval_deterministic)
        return SpreadEval(version, envs, first_episode_steps(envs, obs, act), slice_size)

    def _advance_spread_eval(self) -> None:
        """After a rollout: start the evaluation to spread (the weights held now), or advance it."""
        if self._spread_slice is not None:
            self._spread, self._spread_slice = self._evaluation(self._spread_slice), None
        if self._spread is not None:
            self._spread.advance()

    # ------------------------------------------------------------ checkpoint state

    # How a checkpoint restores into a different number of ranks (hetrun.runtime.resize).
    resize_per_env_keys = ("rollout.obs", "rollout.ep_return", "rollout.ep_len", "rollout.envs")
    resize_rank_stream_keys = ("rng.rank",)

    def envs_per_rank(self) -> int:
        return self.cfg.num_envs

    def fresh_env_state(self, seeds: list[int]) -> dict[str, Any]:
        """The per-environment state of fresh environments, one reset with each seed."""
        obs, envs = [], []
        for s in seeds:
            vec, first = make_vector_env(self.cfg.env_id, 1, s % (2**31 - 1))
            obs.append(torch.as_tensor(first, dtype=torch.float32))
            envs += capture_env_state(vec, self.cfg.env_id)
            vec.close()
        n = len(seeds)
        return {"rollout.obs": torch.cat(obs), "rollout.ep_return": torch.zeros(n, dtype=torch.float64),
                "rollout.ep_len": torch.zeros(n, dtype=torch.int64), "rollout.envs": envs}

    @property
    def optimizer(self) -> torch.optim.Adam:
        # Lazy, and eager(): torch's own optimizer imports torch._dynamo on first use
        # (~1.3 s of CPU per process, on every restart; runtime/eager_optim.py).
        if self._optimizer is None:
            params = ([self._flat_params().param] if self._flat is not None
                      else [*self.actor.parameters(), *self.critic.parameters()])
            self._optimizer = eager(torch.optim.Adam)(params, lr=self.cfg.learning_rate, eps=1e-5)
        return self._optimizer

    def state_dict(self) -> dict[str, Any]:
        """Flat ``{name: Tensor | JSON value}``; no pickled objects, nested keys are dotted.

        The tensors are the live ones, as torch's own ``state_dict()``s return them: every reader
        copies before training goes on (the memory tier's encode, the checkpoint writer's
        snapshot, the lossy path's copy) and a restore decodes into them in place. Copies here
        were a second copy of each tensor at every snapshot, a fifth of the memory tier's cost
        when it snapshots every iteration (benchmarks/node_death.md, session 24)."""
        state: dict[str, Any] = {
            "version": self.version,
            "env_steps": self.env_steps,
            "recent_returns": list(self.recent_returns),
            "rng.rank": self.gen.get_state(),
        }
        if self._flat is not None:
            # Both networks as one tensor (examples/flat_params.py): a snapshot's encode costs per
            # tensor, and this is 1 where by name it was 12 (and Adam's slots 3 where they were 36).
            state[FLAT_KEY] = self._flat_params().param.detach()
        else:
            for name, v in self._net_tensors():
                state[name] = v.detach()  # as Module.state_dict() gives them: no grad, the same memory
        if self._optimizer is not None:  # a rank that never optimized has no optimizer state
            self._optimizer_state(state)
        if self._envs is not None:
            assert self._obs is not None and self._ep_return is not None and self._ep_len is not None
            state["rollout.obs"] = self._obs
            state["rollout.ep_return"] = torch.from_numpy(self._ep_return)
            state["rollout.ep_len"] = torch.from_numpy(self._ep_len)
            state["rollout.envs"] = capture_env_state(self._envs, self.cfg.env_id)
        return state

    def _net_tensors(self) -> list[tuple[str, Tensor]]:
        """The actor's and critic's parameters and buffers under their state_dict names (the live
        tensors, ``state_dict(keep_vars=True)``), listed once per pair of networks.

        Why: ``Module.state_dict()`` walks every submodule and its hooks at each call; right after
        an update, with the caches cold, the two networks' and the optimizer's state_dicts took
        ~0.10 ms of the learner's memory-tier snapshot every iteration against ~0.04 ms for this
        listing and ``_optimizer_state`` (benchmarks/node_death.md, session 38). Exact for this
        example: it never adds, removes or replaces a submodule, parameter or buffer after
        ``__init__`` (the optimizer's step and ``load_state_dict`` write into the tensors in
        place), and a replaced network is listed again. tests/test_ppo.py compares it with
        torch's own state_dicts after updates and after a restore."""
        have = self._net_refs
        if have is None or have[0] is not self.actor or have[1] is not self.critic:
            names = [(f"{prefix}.{k}", v) for prefix, net in (("actor", self.actor), ("critic", self.critic))
                     for k, v in net.state_dict(keep_vars=True).items()]
            have = self._net_refs = (self.actor, self.critic, names)
        return have[2]

    def _optimizer_state(self, state: dict[str, Any]) -> None:
        """Adam's state into ``state`` as ``Optimizer.state_dict()`` numbers it (parameters by
        their place across the param groups, each group's options and its parameters' numbers),
        read from the optimizer's own ``state`` and ``param_groups`` without its packing pass; the
        slots are its live tensors, as the state_dict's are. Parameters in param-group order (the
        state_dict's order is the order they first got state: the same here, Adam's first step
        fills them in that order)."""
        opt = self._optimizer
        assert opt is not None
        slots_of = opt.state
        groups: list[dict[str, Any]] = []
        idx = 0
        for group in opt.param_groups:
            params = group["params"]
            for p in params:
                slots = slots_of.get(p)  # .get: opt.state is a defaultdict, a lookup would add
                if slots:
                    for slot, value in slots.items():
                        state[f"optim.state.{idx}.{slot}"] = value
                idx += 1
            packed = {k: list(v) if isinstance(v, tuple) else v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(idx - len(params), idx))
            groups.append(packed)
        state["optim.param_groups"] = groups

    def _flat_optimizer_state(self, slots: dict[int, dict[str, Tensor]],
                              groups: list[dict[str, Any]]) -> tuple[dict[int, dict[str, Tensor]], list[dict[str, Any]]]:
        """Adam's per-parameter state (a checkpoint written before the flat layout) as the flat
        parameter's: each moment concatenated in the buffer's order, the step count (the same for
        every parameter) once. Raises ValueError where it does not fit."""
        flat = self._flat_params()
        if len(groups) != 1 or len(groups[0]["params"]) != len(flat.params):
            raise ValueError(f"an optimizer state of {sum(len(g['params']) for g in groups)} parameters "
                             f"for networks of {len(flat.params)}")
        order = groups[0]["params"]
        merged: dict[str, Tensor] = {}
        for name in sorted({k for i in order for k in slots.get(i, {})}):
            per = [slots[i][name] for i in order if name in slots.get(i, {})]
            if len(per) != len(order):
                raise ValueError(f"Adam's {name!r} held for {len(per)} of {len(order)} parameters")
            if all(t.dim() == 0 for t in per):  # the step count
                if any(not torch.equal(t, per[0]) for t in per):
                    raise ValueError(f"Adam's {name!r} differs between parameters")
                merged[name] = per[0]
            else:
                merged[name] = flat.slots_from(per)
        return ({0: merged} if merged else {}), [{**groups[0], "params": [0]}]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.version = int(state["version"])
            self.env_steps = int(state["env_steps"])
            self.recent_returns = deque((float(x) for x in state["recent_returns"]), maxlen=20)
            self.gen.set_state(state["rng.rank"])
            if FLAT_KEY in state:
                if self._flat is None:
                    raise ValueError(f"{FLAT_KEY!r}: flat parameters for a workload that keeps them by name")
                flat = self._flat_params().param
                if state[FLAT_KEY].shape != flat.shape:
                    raise ValueError(f"{FLAT_KEY!r} holds {tuple(state[FLAT_KEY].shape)}, the networks "
                                     f"{tuple(flat.shape)}")
                with torch.no_grad():
                    flat.copy_(state[FLAT_KEY])
            else:  # by name (the Atari example; a checkpoint written before the flat layout)
                for prefix, net in (("actor", self.actor), ("critic", self.critic)):
                    net.load_state_dict(
                        {k[len(prefix) + 1 :]: v for k, v in state.items() if k.startswith(prefix + ".")}
                    )
            if "optim.param_groups" in state:
                slots: dict[int, dict[str, Tensor]] = {}
                for key, value in state.items():
                    if key.startswith("optim.state."):
                        _, _, idx, slot = key.split(".", 3)
                        # A copy: torch's optimizer keeps the tensors it is given (no copy when
                        # dtype and device match), and ``state`` may be another live
                        # workload's state_dict() (its tensors are the live ones).
                        slots.setdefault(int(idx), {})[slot] = value.clone()
                groups = [
                    {k: tuple(v) if k == "betas" else v for k, v in g.items()}
                    for g in state["optim.param_groups"]
                ]
                if self._flat is not None and sum(len(g["params"]) for g in groups) > 1:
                    slots, groups = self._flat_optimizer_state(slots, groups)
                self.optimizer.load_state_dict({"state": slots, "param_groups": groups})
            else:
                self._optimizer = None
            if "rollout.envs" in state:
                envs = self._rollout_envs()
                restore_env_state(envs, self.cfg.env_id, state["rollout.envs"])
                self._obs = state["rollout.obs"].clone()
                self._ep_return = state["rollout.ep_return"].numpy().copy()
                self._ep_len = state["rollout.ep_len"].numpy().copy()
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(
                f"PPO checkpoint state does not fit this workload ({type(exc).__name__}: {exc})",
                hint="resume with the same workload_args (env_id, hidden, num_envs) as the run "
                "that wrote it",
            ) from exc

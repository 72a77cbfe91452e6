"""PPO on Atari (gymnasium + ale-py) with an IMPALA-style residual CNN, as a hetrun workload.

The PPO update is examples/ppo.py's, unchanged (clipped surrogate, GAE, value
loss, entropy bonus, minibatch epochs, staleness via the decoupled objective);
this class swaps in what Atari needs:
- observations are uint8 frame stacks [4, 84, 84] (examples/atari_envs.py),
  shipped to the learner as uint8 (4x fewer bytes than float);
- one network with a shared IMPALA encoder and two heads. ``actor`` and
  ``critic`` are views of it, so the PPO code calls them as before; the loss
  calls both on the same minibatch, and the encoder runs once for the pair;
- episodic returns are real game scores across lives, as CleanRL logs them;
  training episodes end at a lost life, and rewards are clipped to their sign.
- GAE takes the values the rollout ranks computed with the behaviour policy
  in the same encoder pass that picked the actions (``gae_values: rollout``,
  the default; CleanRL and SB3 do the same), not a learner-side critic pass
  over the whole batch (``gae_values: learner``, ppo.py's way), which cost
  ~20% of the learner's update here (benchmarks/atari.md). In a pipelined run
  those values come from weights up to ``tolerance_window`` versions old.

Rollout ranks step the games and run the policy on CPU; learner ranks train.

Resume rule (documented, deterministic): the running games are not part of a
checkpoint (an ALE state plus the wrappers' frame buffers would be); a restored
rollout rank starts fresh games seeded by ``SeedSequence([seed, rank,
policy_version])``, ``policy_version`` being the restored one. Weights,
optimizer, version, step counts and the action-sampling generator resume exactly.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from hetrun.dag.workload_args import validate_args
from hetrun.runtime.context import RankContext
from hetrun.runtime.eager_optim import eager
from hetrun.runtime.workload import Workload
from torch import Tensor, nn

from .atari_envs import AtariSettings, AtariVector, num_actions, play_games
from .atari_ppo_args import AtariPPOWorkloadArgs
from .cpu_share import node_cpus
from .ppo import PPOWorkload, env_major

# ---------------------------------------------------------------- configuration


def atari_settings(cfg: AtariPPOWorkloadArgs) -> AtariSettings:
    return AtariSettings(env_id=cfg.env_id, repeat_action_probability=cfg.repeat_action_probability,
                         frame_size=cfg.frame_size, frame_stack=cfg.frame_stack, noop_max=cfg.noop_max)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h


def keep_freed_memory() -> None:
    """Ask glibc's malloc to keep the update's freed activations for the next step instead of
    returning them to the kernel: by default a block over its (adaptive) mmap threshold is a fresh
    mmap each time, and every step then page-faults its ~30 MB activations in again (sys time
    1.75 -> 0.6 s over three updates here; benchmarks/atari.md). Best effort: not glibc, no change.

    ``mallopt`` takes a C int: an earlier ``1 << 34`` here reached glibc as 0 (trim at every free),
    which page-faulted ~17k pages per minibatch step again (benchmarks/atari.md, 4 December).
    One arena for every thread: the update's parts run on a pool thread, whose own arena is built
    of 64 MiB heaps that glibc unmaps once empty (no trim threshold holds them), so that thread
    faulted its activations in at every step. Call it before the process starts its threads."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)  # a value that does not fit raises, not wraps
        mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest, 32 MiB (a half-minibatch's tensors fit)
        mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # keep up to 2 GiB of freed heap (the update reuses it)
        mallopt(M_ARENA_MAX, 1)  # threads allocate from the main heap, which the line above keeps


# ---------------------------------------------------------------- network


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    """IMPALA stage: conv 3x3, max-pool 3x3 stride 2, two residual blocks."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.res0, self.res1 = ResidualBlock(c_out), ResidualBlock(c_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.res1(self.res0(self.pool(self.conv(x))))


class ImpalaEncoder(nn.Module):
    """IMPALA encoder (CleanRL's ppo_atari_envpool IMPALA variant): 3 conv stages, a dense layer.

    Input uint8 frames [B, C, H, W]; scaled to [0, 1] inside. Output [B, hidden].
    """

    def __init__(self, obs_shape: tuple[int, int, int], width: int, hidden: int) -> None:
        super().__init__()
        chans = [obs_shape[0], width, 2 * width, 2 * width]
        self.stages = nn.Sequential(*(ConvSequence(a, b) for a, b in itertools.pairwise(chans)))
        side = obs_shape[1]
        for _ in range(3):
            side = (side + 1) // 2
        self.fc = nn.Linear(chans[-1] * side * side, hidden)

    def forward(self, x: Tensor) -> Tensor:
        # Channels-last frames: on CPU, oneDNN's convolutions and max-pool run ~2x faster on
        # NHWC than on NCHW here (max-pool ~6x); the weights stay NCHW (checkpoints unchanged).
        x = x.contiguous(memory_format=torch.channels_last).float() / 255.0
        return torch.relu(self.fc(torch.relu(self.stages(x)).flatten(1)))


def orthogonal_init(module: nn.Module, gen: torch.Generator, gains: dict[int, float]) -> None:
    """CleanRL's layer_init: orthogonal weights (gain sqrt 2 unless ``gains[id(layer)]``), zero biases."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gains.get(id(layer), math.sqrt(2)), generator=gen)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


class ImpalaAgent(nn.Module):
    """The IMPALA encoder with policy and value heads.

    Input uint8 frames [..., C, H, W] (or flattened [..., C*H*W], as PPO's minibatches are).
    """

    def __init__(self, obs_shape: tuple[int, int, int], width: int, hidden: int, n_actions: int,
                 gen: torch.Generator) -> None:
        super().__init__()
        self.obs_shape = obs_shape
        self.encoder = ImpalaEncoder(obs_shape, width, hidden)
        self.policy = nn.Linear(hidden, n_actions)
        self.value = nn.Linear(hidden, 1)
        orthogonal_init(self, gen, {id(self.policy): 0.01, id(self.value): 1.0})
        # Per calling thread: the learner computes a minibatch's parts on several threads at once.
        self._pending: dict[int, tuple[Tensor, bool, Tensor]] = {}

    def features(self, obs: Tensor) -> Tensor:
        c, h, w = self.obs_shape
        lead = obs.shape[:-3] if tuple(obs.shape[-3:]) == self.obs_shape else obs.shape[:-1]
        return self.encoder(obs.reshape(-1, c, h, w)).reshape(*lead, -1)  # [..., hidden]

    def shared_features(self, obs: Tensor) -> Tensor:
        """Features of ``obs``, reused once by the next call on an equal input.

        PPO's loss evaluates the actor and then the critic on the same minibatch;
        handing the second call the first one's features (same autograd graph)
        runs the encoder once per pair, as a two-headed network does.
        """
        me = threading.get_ident()
        pending = self._pending.pop(me, None)
        grad = torch.is_grad_enabled()
        if pending is not None:
            seen, seen_grad, feats = pending
            if seen_grad == grad and seen.shape == obs.shape and torch.equal(seen, obs):
                return feats
        feats = self.features(obs)
        self._pending[me] = (obs, grad, feats)
        return feats


class _Head(nn.Module):
    """``actor`` (logits) or ``critic`` (value [..., 1]) as a module of its own, sharing the agent."""

    def __init__(self, agent: ImpalaAgent, which: str) -> None:
        super().__init__()
        self.agent = agent
        self.which = which

    def forward(self, obs: Tensor) -> Tensor:
        head = self.agent.policy if self.which == "policy" else self.agent.value
        return head(self.agent.shared_features(obs))


# ---------------------------------------------------------------- the workload


class AtariPPOWorkload(PPOWorkload):
    """One instance per rank: ``AtariPPOWorkload(ctx, **workload_args)``."""

    cfg: AtariPPOWorkloadArgs

    def __init__(self, ctx: RankContext, **workload_args: Any) -> None:
        # Not PPOWorkload.__init__: it builds classic-control MLPs from env_facts, which
        # refuses image observations. The per-rank state it keeps is set in _init_common.
        Workload.__init__(self, ctx, **workload_args)
        self._tls = threading.local()  # a part's own metrics while it runs (_stats, below)
        self._part_pool: ThreadPoolExecutor | None = None
        self._workers = 1  # threads the next minibatch step's parts run on
        self.cfg = cfg = validate_args(AtariPPOWorkloadArgs, workload_args)
        self.settings = atari_settings(cfg)
        self._init_common(ctx)
        torch.set_num_threads(cfg.torch_threads)
        if ctx.mode == "mpi":  # a rank's own process (never a test's or a caller's)
            keep_freed_memory()
        self.n_actions = num_actions(self.settings)
        self.obs_shape = self.settings.obs_shape
        self.agent = ImpalaAgent(self.obs_shape, cfg.impala_width, cfg.hidden, self.n_actions,
                                 torch.Generator().manual_seed(int(ctx.seed)))
        # Views of one network where PPOWorkload has two MLPs (its loss calls them as modules).
        self.actor = _Head(self.agent, "policy")  # type: ignore[assignment]
        self.critic = _Head(self.agent, "value")  # type: ignore[assignment]
        self._vec: AtariVector | None = None

    def _init_common(self, ctx: RankContext) -> None:
        """The per-rank state PPOWorkload keeps (version, counters, streams), without its MLPs."""
        self._optimizer: torch.optim.Adam | None = None
        self._net_refs = None  # PPOWorkload._net_tensors's list (made at the first state_dict)
        self.rank_seed = int(np.random.SeedSequence([int(ctx.seed), ctx.rank]).generate_state(1)[0])
        self.gen = torch.Generator().manual_seed(self.rank_seed)
        self.version = 0
        self.env_steps = 0
        self.recent_returns: deque[float] = deque(maxlen=20)
        self._envs = None  # PPOWorkload's classic-control envs: never built here
        self._obs = None
        self._ep_return = self._ep_len = None
        self._prepared = None
        self._schedule = []
        self._stats = {}
        self._threads_outside_update = None
        self.reward_threshold = None

    # ------------------------------------------------------------ shared parameters

    def parameters_to_sync(self) -> list[Tensor]:
        return list(self.agent.parameters())  # actor and critic share them: each once

    @property
    def optimizer(self) -> torch.optim.Adam:
        if self._optimizer is None:
            # eager(): no torch._dynamo import (~1.3 s of CPU a start; runtime/eager_optim.py)
            self._optimizer = eager(torch.optim.Adam)(self.agent.parameters(), lr=self.cfg.learning_rate,
                                                      eps=1e-5)
        return self._optimizer

    # ------------------------------------------------------------ rollout side

    def _games(self) -> AtariVector:
        if self._vec is None:
            n = self.cfg.num_envs
            seed = np.random.SeedSequence([int(self.ctx.seed), self.ctx.rank, self.version])
            self._vec = AtariVector(self.settings, n, int(seed.generate_state(1)[0]) % (2**31 - n))
        return self._vec

    @torch.no_grad()
    def collect(self, policy_version: int) -> dict[str, Tensor]:
        """``num_steps`` agent steps of ``num_envs`` games; env-major tensors.

        Keys as PPOWorkload.collect's (obs uint8 [N,T,C,H,W], last_obs [N,C,H,W]);
        ``truncated`` is all zeros: a game capped by ALE ends like a lost one.
        """
        vec = self._games()
        n, t_len = self.cfg.num_envs, self.cfg.num_steps
        obs = torch.empty(t_len, n, *self.obs_shape, dtype=torch.uint8)
        actions = torch.empty(t_len, n, dtype=torch.int64)
        logprobs = torch.empty(t_len, n)
        rewards = torch.empty(t_len, n)
        dones = torch.empty(t_len, n)
        values = torch.empty(t_len, n)
        next_obs = torch.from_numpy(vec.obs)
        for t in range(t_len):
            obs[t] = next_obs
            feats = self.agent.features(next_obs)  # one encoder pass for both heads, as SB3's rollout
            values[t] = self.agent.value(feats).squeeze(-1)
            logp_all = torch.log_softmax(self.agent.policy(feats), dim=-1)  # [N, A]
            action = torch.multinomial(logp_all.exp(), 1, generator=self.gen)  # [N, 1]
            actions[t] = action.squeeze(1)
            logprobs[t] = logp_all.gather(1, action).squeeze(1)
            o, r, done = vec.step(actions[t].numpy())
            rewards[t] = torch.as_tensor(r, dtype=torch.float32)
            dones[t] = torch.as_tensor(done, dtype=torch.float32)
            next_obs = torch.from_numpy(o)
        returns, lengths = vec.pop_finished()
        self.env_steps += n * t_len
        self.recent_returns.extend(returns)

        return {
            "obs": env_major(obs),
            "actions": env_major(actions),
            "logprobs": env_major(logprobs),
            "rewards": env_major(rewards),
            "dones": env_major(dones),
            "truncated": torch.zeros(n, t_len),
            "last_obs": next_obs.clone(),
            "values": env_major(values),
            "last_values": self.agent.value(self.agent.features(next_obs)).squeeze(-1),
            "policy_version": torch.full((n,), int(policy_version), dtype=torch.int64),
            "env_steps": torch.tensor([n * t_len], dtype=torch.int64),
            "episode_returns": torch.tensor(returns, dtype=torch.float32),
            "episode_lengths": torch.tensor(lengths, dtype=torch.int64),
        }

    # ------------------------------------------------------------ learner side

    def _gae_values(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The behaviour policy's values from the batch (``gae_values: rollout``), else the learner's."""
        if self.cfg.gae_values == "learner":
            return super()._gae_values(batch)
        return batch["values"], batch["rewards"], batch["last_values"]

    # ------------------------------------------------------------ the update on idle cores
    #
    # Why parts on threads, not more torch threads: one torch thread per part computes a step
    # ~1.9x faster on 2 cores here (batch-64 halves cost no more CPU than the whole minibatch),
    # where 2 intra-op threads on one batch of 128 gave ~1.35x (benchmarks/atari.md); and the
    # sum of fixed parts in a fixed order is the same number however many ran at once, where
    # torch's kernels round differently per thread count. So learner_threads auto changes only
    # how fast a step runs, never what it computes.

    @property
    def _stats(self) -> dict[str, list[float]]:
        """The update's metrics; inside a part (any thread) that part's own, merged in part order
        afterwards, so the metrics too do not depend on which thread finished first."""
        local = getattr(self._tls, "stats", None)
        return self.__dict__["_update_stats"] if local is None else local

    @_stats.setter
    def _stats(self, value: dict[str, list[float]]) -> None:
        self.__dict__["_update_stats"] = value

    def _update_threads(self) -> None:
        """learner_threads auto: the parts of the next step run on the node's cores its rollout
        ranks leave idle right now (examples/cpu_share.py), one torch thread each."""
        if self.cfg.learner_threads != "auto":
            self._workers = 1
            super()._update_threads()
            return
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        phase = self._phase("learner")
        cpus = node_cpus()
        # Only the node's rollout ranks count here, not the host's other runnable work (/proc/loadavg,
        # which caps the intra-op threads of ppo.py's auto): parts never spin-wait for each other (one
        # join per step), so a descheduled part costs only its own time. Measured at load 2.9-3.8:
        # 2 parts at once 11.0 / 7.1 s an update vs in turn 10.9 / 10.1 s (benchmarks/atari.md).
        free = cpus if phase is None else phase.update_threads(cpus)
        first = not self._update_thread_counts  # the runtime's step: its micro-batches run in turn
        self._workers = 1 if first else max(1, min(self.cfg.update_parts, free))
        self._update_thread_counts.append(self._workers)

    def _minibatch_backward(self, minibatch: Tensor) -> None:
        """The minibatch's gradient as the sum, in part order, of ``update_parts`` equal parts'
        gradients, the parts spread over ``self._workers`` threads (this one included)."""
        n = self.cfg.update_parts
        if n == 1:
            super()._minibatch_backward(minibatch)
            return
        parts = minibatch.tensor_split(n)
        params = self.parameters_to_sync()
        results: list[Any] = [None] * n

        def chain(first: int, stride: int) -> None:
            try:
                for i in range(first, n, stride):
                    self._tls.stats = {}
                    grads = torch.autograd.grad(self._loss(minibatch, parts[i]), params)
                    results[i] = (grads, self._tls.stats)
            finally:
                self._tls.stats = None

        workers = min(self._workers, n)
        if workers > 1:
            if self._part_pool is None:
                self._part_pool = ThreadPoolExecutor(n - 1, thread_name_prefix="ppo-part",
                                                     initializer=torch.set_num_threads, initargs=(1,))
            futures = [self._part_pool.submit(chain, j, workers) for j in range(1, workers)]
            chain(0, workers)
            for f in futures:
                f.result()
        else:
            chain(0, 1)
        for _, stats in results:  # in part order: the same sum and metrics however they ran
            for key, values in stats.items():
                self._stats.setdefault(key, []).extend(values)
        for k, p in enumerate(params):
            total = results[0][0][k]
            for grads, _ in results[1:]:
                total = total.add_(grads[k])
            p.grad = total if p.grad is None else p.grad.add_(total)

    # ------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean real score of ``eval_episodes`` games with sampled actions, seeded by (seed, version)."""
        n = self.cfg.eval_episodes
        seed = int(np.random.SeedSequence([int(self.ctx.seed), 1, self.version]).generate_state(1)[0])
        gen = torch.Generator().manual_seed(seed)

        def choose(obs: np.ndarray, running: np.ndarray) -> np.ndarray:
            # The policy runs on the running games only; the draw covers every game (finished
            # ones get a uniform row), so the stream gives each game what a full batch would.
            probs = torch.full((len(running), self.n_actions), 1.0 / self.n_actions)
            logits = self.agent.policy(self.agent.features(torch.from_numpy(obs)))
            probs[torch.from_numpy(running)] = torch.softmax(logits, -1)
            return torch.multinomial(probs, 1, generator=gen).squeeze(1).numpy()[running]

        scores = play_games(self.settings, n, seed % (2**31 - n), choose, self.cfg.eval_max_steps)
        return {
            "eval_return_mean": float(scores.mean()),
            "eval_return_min": float(scores.min()),
            "eval_return_max": float(scores.max()),
            "eval_return_std": float(scores.std(ddof=1)) if n > 1 else 0.0,
            "eval_episodes": float(n),
            "policy_version": float(self.version),
        }

    # ------------------------------------------------------------ checkpoint state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self._vec is not None:  # fresh games under the resume rule (module docstring)
            self._vec.close()
            self._vec = None

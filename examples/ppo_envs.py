"""Vectorized gymnasium environments for the PPO example, and their exact state.

Rollout ranks keep their environments running across rollouts (an episode
spans many rollouts), so a checkpoint that must resume *exactly* has to carry
each sub-environment's physical state, step counter and random generator.
Classic-control environments (CartPole, Acrobot, MountainCar, Pendulum...)
keep all of that in plain attributes; we copy them as JSON values, never pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from hetrun.errors import CheckpointError, SpecError


def env_facts(env_id: str) -> tuple[int, int, float | None, int | None]:
    """(observation size, number of actions, reward threshold, episode step limit) of ``env_id``.

    Raises SpecError for an unknown id or a space this discrete-action MLP agent cannot drive.
    """
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise SpecError(
            f"unknown gymnasium environment {env_id!r} ({exc})",
            key_path="workload_args.env_id",
            value=env_id,
            hint="use a registered id such as CartPole-v1 or Acrobot-v1",
        ) from exc
    probe = gym.make(env_id)
    try:
        obs_space, act_space = probe.observation_space, probe.action_space
    finally:
        probe.close()
    if not isinstance(act_space, gym.spaces.Discrete) or not (
        isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    ):
        raise SpecError(
            f"{env_id} has observation space {obs_space} and action space {act_space}; "
            "the PPO example drives a flat Box observation and a Discrete action",
            key_path="workload_args.env_id",
            value=env_id,
            hint="use CartPole-v1, Acrobot-v1 or another discrete-action classic-control env",
        )
    return int(obs_space.shape[0]), int(act_space.n), spec.reward_threshold, spec.max_episode_steps


def make_vector_env(env_id: str, num_envs: int, seed: int) -> tuple[SyncVectorEnv, np.ndarray]:
    """A synchronous vector env, reset with seeds ``seed .. seed+num_envs-1``; returns (envs, obs).

    SAME_STEP autoreset: the step that ends an episode already returns the next
    episode's first observation, and the ending one in ``info["final_obs"]``,
    so every transition in a rollout is a real one (no ignored reset steps).
    """
    envs = SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=[seed + i for i in range(num_envs)])
    return envs, obs


def make_eval_env(env_id: str, num_envs: int, seed: int) -> tuple[Any, np.ndarray]:
    """Environments for evaluation episodes, reset with ``seed``; returns (envs, obs).

    Where gymnasium ships a numpy-vectorized version of the env (CartPole-v1's
    ``vector_entry_point``) it steps all episodes in one call, ~3x cheaper than
    one Python env per episode: evaluation is pure overhead on the training
    loop (benchmarks/ppo.md). Evaluation keeps only each env's first episode,
    so the vectorized env's next-step autoreset never enters a return. Others:
    :func:`make_vector_env`.
    """
    if gym.spec(env_id).vector_entry_point is not None:
        envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
        obs, _ = envs.reset(seed=seed)
        return envs, obs
    return make_vector_env(env_id, num_envs, seed)


def first_episode_returns(envs: Any, obs: np.ndarray, act: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Return of each environment's first episode from ``obs``, stepping with ``act(obs) -> actions``.

    ``act`` sees every environment's observation each step (an ended episode's row is stale
    and its action unused), so a sampling policy draws the same random numbers per step
    whichever episodes are still running. gymnasium's numpy CartPole takes a fast path
    (:func:`_cartpole_first_episodes`); every other env steps through its own ``step``.
    """
    steps = first_episode_steps(envs, obs, act)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def first_episode_steps(envs: Any, obs: np.ndarray,
                        act: Callable[[np.ndarray], np.ndarray]) -> Generator[None, None, np.ndarray]:
    """:func:`first_episode_returns` one batched step at a time: yields after each step, returns
    the returns (an evaluation spread over several rollouts advances it a slice at a time)."""
    if _cartpole_fast_path(envs):
        return (yield from _cartpole_first_episodes(envs, obs, act))
    n = len(obs)
    returns = np.zeros(n)
    running = np.ones(n, dtype=bool)
    while running.any():
        obs, r, term, trunc, _ = envs.step(act(obs))
        returns += r * running  # envs past their first episode no longer count
        running &= ~np.logical_or(term, trunc)
        yield
    return returns


def _cartpole_fast_path(envs: Any) -> bool:
    # Fresh from reset (the step counters at 0), gymnasium's default physics and reward.
    return (type(envs) is CartPoleVectorEnv and envs.kinematics_integrator == "euler"
            and not getattr(envs, "_sutton_barto_reward", False) and not envs.steps.any())


def _cartpole_first_episodes(env: CartPoleVectorEnv, obs: np.ndarray,
                             act: Callable[[np.ndarray], np.ndarray]) -> Generator[None, None, np.ndarray]:
    """``first_episode_returns`` on gymnasium's CartPoleVectorEnv, ~1.9x cheaper than its ``step``.

    Evaluation is pure overhead on the learner (benchmarks/ppo.md): its env step spent more
    time validating the action, stacking and re-drawing reset states for ended episodes than
    in the physics. Here the episodes advance with gymnasium 1.x's Euler
    update, operation for operation (float64 state, the float32 observation cast), so every
    running episode's trajectory is bit-identical to ``env.step`` (tests/test_ppo_eval.py
    checks it against gymnasium itself). Ended episodes never auto-reset: their returns are
    final, and a reset only draws from the env's generator, which running episodes never use.
    Every episode starts at the reset (step 0), so the time limit is one step count for all.
    """
    x, x_dot, theta, theta_dot = np.array(env.state, dtype=np.float64)  # each [n]
    n = len(x)
    returns = np.zeros(n)
    running = np.ones(n, dtype=bool)
    obs32 = np.empty((n, 4), dtype=np.float32)  # reused: act() reads it before the next step
    for step in range(1, env.max_episode_steps + 1):
        action = act(obs)
        # gymnasium.envs.classic_control.cartpole.CartPoleVectorEnv.step, same operations
        # (on every env: those past their first episode are ignored, not stopped).
        force = np.sign(action - 0.5) * env.force_mag
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + env.polemass_length * np.square(theta_dot) * sintheta) / env.total_mass
        thetaacc = (env.gravity * sintheta - costheta * temp) / (
            env.length * (4.0 / 3.0 - env.masspole * np.square(costheta) / env.total_mass)
        )
        xacc = temp - env.polemass_length * thetaacc * costheta / env.total_mass
        x = x + env.tau * x_dot
        x_dot = x_dot + env.tau * xacc
        theta = theta + env.tau * theta_dot
        theta_dot = theta_dot + env.tau * thetaacc
        # = (x < -x_threshold) | (x > x_threshold) | (theta < -...) | (theta > ...), exactly
        terminated = (np.abs(x) > env.x_threshold) | (np.abs(theta) > env.theta_threshold_radians)
        returns += running  # CartPole's reward: 1 for every step, the last one included
        running &= ~terminated
        if step >= env.max_episode_steps or not running.any():  # gymnasium's truncation
            break
        for col, value in enumerate((x, x_dot, theta, theta_dot)):
            obs32[:, col] = value  # = state.T.astype(np.float32), without the stack
        obs = obs32
        yield
    return returns


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit | None:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return env
        env = env.env
    return None


def _require_state(env_id: str, raw: gym.Env) -> None:
    if not hasattr(raw, "state"):
        raise CheckpointError(
            f"cannot checkpoint the running environments of {env_id}: its state is not a plain "
            "`state` attribute (only classic-control environments are supported)",
            hint="use CartPole-v1 or Acrobot-v1, or checkpoint only the learner",
        )


def capture_env_state(envs: SyncVectorEnv, env_id: str) -> list[dict[str, Any]]:
    """JSON-able state of every sub-environment (physics, step counters, RNG)."""
    out: list[dict[str, Any]] = []
    # Pending autoresets (used by the NEXT_STEP mode; SAME_STEP leaves them False).
    autoreset = [bool(x) for x in getattr(envs, "_autoreset_envs", [False] * len(envs.envs))]
    for env, pending in zip(envs.envs, autoreset, strict=True):
        raw: Any = env.unwrapped  # classic-control envs keep their physics in `state`
        _require_state(env_id, raw)
        limit: Any = _time_limit(env)
        out.append(
            {
                "state": np.asarray(raw.state, dtype=np.float64).tolist(),
                # CartPole counts steps after termination to warn on misuse; keep it exact.
                "steps_beyond_terminated": getattr(raw, "steps_beyond_terminated", None),
                "elapsed_steps": limit._elapsed_steps if limit is not None else None,
                "rng": raw.np_random.bit_generator.state,
                "autoreset": pending,
            }
        )
    return out


def restore_env_state(envs: SyncVectorEnv, env_id: str, states: list[dict[str, Any]]) -> None:
    """Inverse of :func:`capture_env_state` on envs built with the same id and count."""
    if len(states) != len(envs.envs):
        raise CheckpointError(
            f"checkpoint holds {len(states)} {env_id} environments but this rank runs "
            f"{len(envs.envs)}",
            hint="resume with the same workload_args.num_envs the checkpoint was written with",
        )
    for env, st in zip(envs.envs, states, strict=True):
        raw: Any = env.unwrapped  # classic-control envs keep their physics in `state`
        _require_state(env_id, raw)
        raw.state = np.asarray(st["state"], dtype=np.float64)
        if hasattr(raw, "steps_beyond_terminated"):
            raw.steps_beyond_terminated = st["steps_beyond_terminated"]
        limit: Any = _time_limit(env)
        if limit is not None and st["elapsed_steps"] is not None:
            limit._elapsed_steps = int(st["elapsed_steps"])
        raw.np_random.bit_generator.state = st["rng"]
    flags = getattr(envs, "_autoreset_envs", None)
    if flags is not None:
        flags[:] = [bool(st.get("autoreset", False)) for st in states]

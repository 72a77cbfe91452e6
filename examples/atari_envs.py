"""Atari environments for the PPO example: gymnasium + ale-py, standard preprocessing.

The wrapper stack follows CleanRL's ``ppo_atari.py`` (itself the DQN paper's
preprocessing), built from gymnasium's own wrappers where they exist:

    ALE env (frameskip=1)                      ale-py ships the ROMs: nothing is downloaded
    GameScore         the real game's score and length, across lives (what users report)
    AtariPreprocessing  noop reset (1..30 no-ops), frame skip 4 with max-pool over the
                        last two frames, grey 84x84
    EpisodicLife      a lost life ends the *training* episode; the game goes on
    FireReset         press FIRE after a reset in games that wait for it (Breakout)
    TransformReward   reward clipped to its sign
    FrameStack        the last 4 frames, shifted in place: observation uint8 [4, 84, 84]
                      (gymnasium's FrameStackObservation's bytes, without its per-step copies)

``repeat_action_probability`` defaults to 0 as in CleanRL's ``*NoFrameskip-v4``
ids (v5's sticky actions, 0.25, are available by setting it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from hetrun.errors import SpecError

gym.register_envs(ale_py)


@dataclass(frozen=True)
class AtariSettings:
    env_id: str = "ALE/Breakout-v5"
    repeat_action_probability: float = 0.0
    frame_size: int = 84
    frame_stack: int = 4
    frame_skip: int = 4
    noop_max: int = 30
    episodic_life: bool = True
    clip_reward: bool = True

    @property
    def obs_shape(self) -> tuple[int, int, int]:
        return (self.frame_stack, self.frame_size, self.frame_size)


class GameScore(gym.Wrapper):
    """Sums the raw reward of a whole game (all lives); finished games wait in ``finished``.

    It sits below EpisodicLife, so a lost life does not end its count: the
    figures match what CleanRL logs as ``episodic_return``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.score = 0.0
        self.length = 0  # agent steps
        self.finished: list[tuple[float, int]] = []

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        self.length += 1
        if terminated or truncated:
            self.finished.append((self.score, self.length))
            self.score, self.length = 0.0, 0
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> Any:
        self.score, self.length = 0.0, 0
        return self.env.reset(**kwargs)

    def pop_game_scores(self) -> list[float]:
        """Scores of the games finished since the last call (for vector envs in other
        processes, e.g. SB3's ``env_method``, which reach it through the wrapper chain)."""
        out = [score for score, _ in self.finished]
        self.finished.clear()
        return out


class EpisodicLife(gym.Wrapper):
    """A lost life is a terminal state for learning; the next reset continues the same game."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())  # type: ignore[attr-defined]

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self._ale_lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> Any:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # a no-op step moves on from the lost life without restarting the game
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self._ale_lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after a reset: games like Breakout wait for it."""

    def reset(self, **kwargs: Any) -> Any:
        self.env.reset(**kwargs)
        obs = info = None
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class FrameStack(gym.ObservationWrapper):
    """The last ``size`` frames, oldest first; a reset fills the stack with its frame.

    gymnasium's FrameStackObservation gives the same bytes (padding "reset"), but it
    concatenates a deque into a buffer and deep-copies that on every step; here the stack
    shifts in place and the caller gets one copy (it may keep it: the stack moves on).
    """

    def __init__(self, env: gym.Env, size: int) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(0, 255, (size, *space.shape), dtype=np.uint8)  # type: ignore[arg-type]
        self._stack = np.zeros(self.observation_space.shape, dtype=np.uint8)

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self._stack[:] = obs
        return self._stack.copy(), info

    def observation(self, observation: Any) -> np.ndarray:
        self._stack[:-1] = self._stack[1:]  # numpy copies overlapping slices as if through a buffer
        self._stack[-1] = observation
        return self._stack.copy()


def _check_env_id(env_id: str) -> gym.envs.registration.EnvSpec:
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise SpecError(
            f"unknown gymnasium environment {env_id!r} ({exc})",
            key_path="workload_args.env_id", value=env_id,
            hint="use an ale-py id such as ALE/Breakout-v5 or ALE/Pong-v5",
        ) from exc
    if not str(spec.entry_point).startswith("ale_py"):
        raise SpecError(
            f"{env_id} is not an Atari (ale-py) environment",
            key_path="workload_args.env_id", value=env_id,
            hint="use an ALE/<Game>-v5 id, or hetrun.examples.ppo:PPOWorkload for classic control",
        )
    return spec


def make_atari_env(s: AtariSettings) -> gym.Env:
    """One preprocessed Atari env (see the module docstring for the wrapper order)."""
    _check_env_id(s.env_id)
    # The ALE env's own observation is never read (AtariPreprocessing copies the grey screen
    # from the emulator into its buffers on the last two frames of a skip): obs_type grayscale
    # keeps it from building an RGB screen on every emulated frame (~20% of the raw ALE cost).
    # The passive checker only checks a first step's types, on every step's call path.
    env: gym.Env = gym.make(s.env_id, frameskip=1, repeat_action_probability=s.repeat_action_probability,
                            full_action_space=False, obs_type="grayscale", disable_env_checker=True)
    env = GameScore(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=s.noop_max, frame_skip=s.frame_skip,
                                          screen_size=s.frame_size, grayscale_obs=True,
                                          terminal_on_life_loss=False, scale_obs=False)
    if s.episodic_life:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]
        env = FireReset(env)
    if s.clip_reward:
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))
    return FrameStack(env, s.frame_stack)


def num_actions(s: AtariSettings) -> int:
    """Size of the game's minimal action set."""
    _check_env_id(s.env_id)
    probe = gym.make(s.env_id, full_action_space=False)
    try:
        return int(probe.action_space.n)  # type: ignore[attr-defined]
    finally:
        probe.close()


def _score_of(env: gym.Env) -> GameScore:
    while not isinstance(env, GameScore):
        env = env.env  # type: ignore[attr-defined]
    return env


class AtariVector:
    """``num_envs`` preprocessed games stepped in lock-step, with finished games' real scores.

    SAME_STEP autoreset: the step that ends a training episode already returns
    the next one's first observation, so every transition is a real one.
    """

    def __init__(self, s: AtariSettings, num_envs: int, seed: int) -> None:
        self.envs = SyncVectorEnv([lambda: make_atari_env(s) for _ in range(num_envs)],
                                  autoreset_mode=AutoresetMode.SAME_STEP)
        self.scores = [_score_of(e) for e in self.envs.envs]
        self.obs, _ = self.envs.reset(seed=[seed + i for i in range(num_envs)])  # uint8 [N,C,H,W]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(obs, clipped rewards, done) after one agent step; done = lost life or game over."""
        obs, reward, terminated, truncated, _ = self.envs.step(actions)
        self.obs = obs
        # ALE's 108k-frame cap counts as game over, as in CleanRL: nothing is bootstrapped.
        return obs, reward, np.logical_or(terminated, truncated)

    def pop_finished(self) -> tuple[list[float], list[int]]:
        """Scores and lengths (agent steps) of the games finished since the last call."""
        returns: list[float] = []
        lengths: list[int] = []
        for tracker in self.scores:
            for score, length in tracker.finished:
                returns.append(score)
                lengths.append(length)
            tracker.finished.clear()
        return returns, lengths

    def close(self) -> None:
        self.envs.close()


def play_games(s: AtariSettings, games: int, seed: int, choose: Any, max_steps: int) -> np.ndarray:
    """Real scores of ``games`` games, game ``i`` reset with seed ``seed + i``.

    ``choose(obs, running)`` picks the actions: ``obs`` uint8 [k, C, H, W] holds the
    ``k`` games still running (in game order), ``running`` bool [games] says which
    they are; it returns ``k`` actions. Only running games are stepped and shown to
    the policy: a finished game's env is not played on (a lock-step vector env
    would go on stepping it, and running the policy on it, until the longest game
    ends). ``running`` lets a sampling policy draw from its stream exactly as if
    every game were still running, so each game's actions are those a lock-step
    batch of all ``games`` would draw. A lost life continues the same game (the
    env's reset does that, EpisodicLife); a game still running after
    ``max_steps`` agent steps counts with its score so far.
    """
    envs = [make_atari_env(s) for _ in range(games)]
    trackers = [_score_of(env) for env in envs]
    scores = np.full(games, np.nan)
    running = np.ones(games, dtype=bool)
    try:
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
        for _ in range(max_steps):
            playing = np.flatnonzero(running)
            actions = np.asarray(choose(obs[playing], running.copy()))
            for i, action in zip(playing, actions, strict=True):
                o, _, terminated, truncated, _ = envs[i].step(int(action))
                if trackers[i].finished:  # the game is over (GameScore sits below EpisodicLife)
                    scores[i] = trackers[i].finished[0][0]
                    running[i] = False
                    continue
                if terminated or truncated:  # a lost life: the reset goes on with the same game
                    o, _ = envs[i].reset()
                obs[i] = o
            if not running.any():
                break
        scores[running] = [trackers[i].score for i in np.flatnonzero(running)]
    finally:
        for env in envs:
            env.close()
    return scores


def random_policy_scores(s: AtariSettings, games: int, seed: int, max_steps: int) -> np.ndarray:
    """The uniform-random baseline every Atari result is compared against.

    One draw per game per step, finished games included (``play_games``), so a
    game's actions do not depend on when the others end.
    """
    n = num_actions(s)
    rng = np.random.default_rng(seed)
    return play_games(s, games, seed, lambda obs, running: rng.integers(n, size=len(running))[running],
                      max_steps)

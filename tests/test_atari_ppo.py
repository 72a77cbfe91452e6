"""The Atari PPO example's parts: preprocessing, batches, the shared encoder, checkpoint state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hetrun.examples.atari_envs import (
    AtariSettings,
    AtariVector,
    make_atari_env,
    num_actions,
    play_games,
    random_policy_scores,
)
from hetrun.examples.atari_ppo import AtariPPOWorkload
from hetrun.runtime.context import RankContext

from hetrun.errors import SpecError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ppo_atari.yaml"
SMALL = {"env_id": "ALE/Breakout-v5", "num_envs": 2, "num_steps": 16, "impala_width": 4, "hidden": 32,
         "num_minibatches": 2, "update_epochs": 1, "eval_episodes": 2, "eval_max_steps": 50}


def ctx(rank: int, component: str) -> RankContext:
    return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                       group=None, comm=None, device="cpu", seed=3, run_dir=Path("."), mode="inprocess")


def test_preprocessing_gives_stacked_grey_84x84_frames_and_a_life_ends_an_episode() -> None:
    s = AtariSettings(env_id="ALE/Breakout-v5")
    env = make_atari_env(s)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert num_actions(s) == 4
    lives_lost = 0
    for _ in range(2000):  # NOOP after FireReset's launch: the ball is missed, a life goes
        obs, reward, terminated, truncated, _ = env.step(0)
        assert reward in (0.0, 1.0)  # clipped to its sign
        if terminated:
            lives_lost += 1
            if env.unwrapped.ale.lives() > 0:
                break
            pytest.fail("the game ended before a single life was lost")
        assert not truncated
    assert lives_lost == 1 and not env.unwrapped.ale.game_over()


def test_vector_games_report_real_scores_across_lives() -> None:
    vec = AtariVector(AtariSettings(env_id="ALE/Breakout-v5"), 2, seed=0)
    rng = np.random.default_rng(0)
    finished: list[float] = []
    lives_ended = 0
    for _ in range(3000):
        _, _, done = vec.step(rng.integers(4, size=2))
        lives_ended += int(done.sum())
        finished += vec.pop_finished()[0]
        if len(finished) >= 2:
            break
    vec.close()
    assert len(finished) >= 2
    assert lives_ended >= 5 * len(finished)  # Breakout: 5 lives per game, each a training episode


def test_rollout_batch_and_one_update() -> None:
    learner, roller = AtariPPOWorkload(ctx(0, "learner"), **SMALL), AtariPPOWorkload(ctx(1, "rollout"), **SMALL)
    roller.load_policy(learner.policy_state(), 0)
    batch = roller.rollout(0)
    assert batch["obs"].shape == (2, 16, 4, 84, 84) and batch["obs"].dtype == torch.uint8
    assert batch["last_obs"].shape == (2, 4, 84, 84)
    assert batch["actions"].shape == batch["logprobs"].shape == batch["dones"].shape == (2, 16)
    assert int(batch["env_steps"]) == 32
    assert len(learner.parameters_to_sync()) == len({id(p) for p in learner.parameters_to_sync()})
    before = [p.detach().clone() for p in learner.parameters_to_sync()]
    for micro in range(2):
        learner.backward(learner.forward(batch, micro, 2))
    metrics = learner.optimize()
    assert metrics["policy_version"] == 1.0 and metrics["env_steps"] == 32.0
    assert all(not torch.equal(a, b) for a, b in zip(before, learner.parameters_to_sync(), strict=True))


def test_the_encoder_runs_once_for_the_actor_and_critic_of_one_minibatch() -> None:
    wl = AtariPPOWorkload(ctx(0, "learner"), **SMALL)
    calls: list[int] = []
    real = wl.agent.features

    def counted(obs: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return real(obs)

    wl.agent.features = counted
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    logits, value = wl.actor(obs.clone()), wl.critic(obs.clone())
    assert len(calls) == 1 and logits.shape == (3, 4) and value.shape == (3, 1)
    (logits.sum() + value.sum()).backward()  # one graph: both heads' gradients reach the encoder
    wl.critic(obs)
    assert len(calls) == 2  # a pair is used once: the next call computes afresh
    other = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    wl.actor(other)
    wl.critic(obs)  # a different input: no reuse
    assert len(calls) == 4


def test_checkpoint_state_resumes_weights_optimizer_and_streams_exactly() -> None:
    a = AtariPPOWorkload(ctx(0, "learner"), **SMALL)
    roller = AtariPPOWorkload(ctx(1, "rollout"), **SMALL)
    batch = roller.rollout(0)
    for micro in range(2):
        a.backward(a.forward(batch, micro, 2))
    a.optimize()
    state = a.state_dict()
    assert not any(isinstance(v, bytes) for v in state.values())
    b = AtariPPOWorkload(ctx(0, "learner"), **SMALL)
    b.load_state_dict(state)
    for wl in (a, b):
        for micro in range(2):
            wl.backward(wl.forward(batch, micro, 2))
        wl.optimize()
    for pa, pb in zip(a.parameters_to_sync(), b.parameters_to_sync(), strict=True):
        assert torch.equal(pa, pb)


def test_a_non_atari_env_is_refused_before_anything_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(EXAMPLE), "--set",
                          "workload_args.env_id=CartPole-v1"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "workload_args.env_id" in out.stderr and "ALE/" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(SpecError, match="unknown gymnasium environment"):
        num_actions(AtariSettings(env_id="ALE/NoSuchGame-v5"))


def test_a_restored_rollout_rank_plays_fresh_games_seeded_by_the_restored_version() -> None:
    first = AtariPPOWorkload(ctx(1, "rollout"), **SMALL)
    first.load_policy(first.policy_state(), 5)
    first.rollout(5)
    state = first.state_dict()
    a, b = AtariPPOWorkload(ctx(1, "rollout"), **SMALL), AtariPPOWorkload(ctx(1, "rollout"), **SMALL)
    a.load_state_dict(state)
    b.load_state_dict(state)
    ba, bb = a.rollout(5), b.rollout(5)
    assert all(torch.equal(ba[k], bb[k]) for k in ba)  # the documented rule is deterministic
    fresh = AtariPPOWorkload(ctx(1, "rollout"), **SMALL)
    assert not torch.equal(fresh.rollout(0)["obs"], ba["obs"])  # version 5's seeds, not version 0's


def test_gae_takes_the_behaviour_values_the_rollout_computed_unless_told_to_use_the_learners() -> None:
    learner = AtariPPOWorkload(ctx(0, "learner"), **SMALL)
    roller = AtariPPOWorkload(ctx(1, "rollout"), **SMALL)
    roller.load_policy(learner.policy_state(), 0)
    batch = roller.rollout(0)
    assert batch["values"].shape == (2, 16) and batch["last_values"].shape == (2,)
    with torch.no_grad():  # the rollout's values are the (same-weights) critic's, per step and at the end
        torch.testing.assert_close(batch["values"], learner.critic(batch["obs"]).squeeze(-1))
        torch.testing.assert_close(batch["last_values"], learner.critic(batch["last_obs"]).squeeze(-1))
    marked = {**batch, "values": batch["values"] + 100.0}  # tell the two sources apart
    values, _, last = learner._gae_values(marked)
    assert torch.equal(values, marked["values"]) and torch.equal(last, batch["last_values"])
    own = AtariPPOWorkload(ctx(0, "learner"), **SMALL, gae_values="learner")
    with torch.no_grad():
        values, rewards, _ = own._gae_values(marked)
    torch.testing.assert_close(values, batch["values"])  # recomputed: the marked values are ignored
    assert torch.equal(rewards, batch["rewards"])
    with pytest.raises(SpecError, match="gae_values"):
        AtariPPOWorkload(ctx(0, "learner"), **SMALL, gae_values="critic")


def _lock_step_scores(s: AtariSettings, games: int, seed: int, choose: Any, max_steps: int) -> np.ndarray:
    """The reference: every game stepped in one lock-step vector env (finished ones reset and
    played on) until all are over; each game's first score, or its score so far at the cap."""
    vec = AtariVector(s, games, seed)
    scores = np.full(games, np.nan)
    for _ in range(max_steps):
        vec.step(np.asarray(choose(vec.obs)))
        for i, tracker in enumerate(vec.scores):
            if tracker.finished and np.isnan(scores[i]):
                scores[i] = tracker.finished[0][0]
            tracker.finished.clear()
        if not np.isnan(scores).any():
            break
    running = np.isnan(scores)
    scores[running] = [vec.scores[i].score for i in np.flatnonzero(running)]
    vec.close()
    return scores


def test_evaluation_plays_only_running_games_and_scores_what_a_lock_step_batch_scores() -> None:
    s = AtariSettings(env_id="ALE/Breakout-v5")
    shown: list[int] = []
    rng = np.random.default_rng(5)

    def uniform(obs: np.ndarray, running: np.ndarray) -> np.ndarray:
        shown.append(len(obs))
        return rng.integers(4, size=len(running))[running]

    scores = play_games(s, 3, 5, uniform, max_steps=400)
    assert shown[0] == 3 and shown[-1] == 1  # finished games drop out of the batch
    ref_rng = np.random.default_rng(5)
    expected = _lock_step_scores(s, 3, 5, lambda obs: ref_rng.integers(4, size=len(obs)), 400)
    assert np.array_equal(scores, expected)
    assert np.array_equal(random_policy_scores(s, 3, 5, 400), expected)
    capped = play_games(s, 3, 5, lambda obs, running: np.zeros(len(obs), dtype=np.int64), max_steps=30)
    assert len(capped) == 3 and not np.isnan(capped).any()  # games still running count their score so far

    # The trained policy's evaluation: sampled actions, seeded by (seed, version), same scores.
    wl = AtariPPOWorkload(ctx(0, "learner"), **{**SMALL, "eval_episodes": 3, "eval_max_steps": 400})
    got = wl.evaluate()
    seed = int(np.random.SeedSequence([3, 1, 0]).generate_state(1)[0])
    gen = torch.Generator().manual_seed(seed)

    def sampled(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            probs = torch.softmax(wl.actor(torch.from_numpy(obs)), -1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(1).numpy()

    ref = _lock_step_scores(s, 3, seed % (2**31 - 3), sampled, 400)
    assert got["eval_episodes"] == 3
    assert (got["eval_return_mean"], got["eval_return_min"], got["eval_return_max"]) == (
        float(ref.mean()), float(ref.min()), float(ref.max()))


def test_an_atari_rank_reuses_freed_activation_memory_without_page_faults() -> None:
    """keep_freed_memory, in a process of its own (malloc settings are process-wide): a step's
    freed 24 MB blocks (activations' size), on the main thread and on a second thread (the
    update's parts run on one), are handed back to the next step without the kernel faulting their
    pages in again. The old code passed 1 << 34 as mallopt's int: glibc read 0 and trimmed the heap
    at every free (~18,000 faults here on the main thread); a thread's own arena unmapped its
    emptied heaps whatever the trim threshold (~37,000)."""
    script = """
import ctypes, resource, threading
from hetrun.examples.atari_ppo import keep_freed_memory
keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
size = 24 << 20
def step():
    blocks = [libc.malloc(size) for _ in range(4)]
    for block in blocks:
        libc.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
def faults():
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults()
thread = threading.Thread(target=faults)
thread.start()
thread.join()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    main_thread, other_thread = (int(line) for line in out.stdout.split()[-2:])
    # 3 steps of 96 MB are ~70,000 pages: a few hundred faults are the interpreter's own.
    assert main_thread < 500, f"{main_thread} page faults over 3 reuses of freed 24 MB blocks on the main thread"
    assert other_thread < 500, f"{other_thread} page faults over 3 reuses of freed 24 MB blocks on a thread"

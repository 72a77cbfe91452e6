"""The documented seed rule of a resize (docs/CONTRACTS.md, "Resume and resize"), 2 -> 3 -> 2 -> 3.

Real PPO rollout workers on real gymnasium CartPole, real 2- and 3-rank
checkpoints (threads stand in for the ranks' all-gather). The expected seeds
are computed here from the documented formulas, not by calling resize.py:
env seed of a fresh global environment g = SeedSequence([seed, 0, g,
restart_count]); a new rank j's global generators from SeedSequence([seed, 2,
j, restart_count]) and its `rng.rank` torch stream from SeedSequence([seed, 1,
j, restart_count]) + 0. The fresh environments are checked against
gymnasium's own CartPole reset with that seed.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hetrun.examples.ppo import PPOWorkload
from hetrun.runtime import resize
from hetrun.runtime.ckpt import open_store, tiers_for
from hetrun.runtime.ckpt.state import capture_rng, restore_rng
from hetrun.runtime.ckpt.writer import CheckpointWriter
from hetrun.runtime.context import RankContext

from tests.resume_compare import differences, flat
from tests.test_resize import SMALL, ThreadCollective

SEED, K = 11, SMALL["num_envs"]  # K environments per rollout rank


def documented(*words: int) -> int:
    return int(np.random.SeedSequence(list(words)).generate_state(1)[0])


def worker(comp_rank: int, comp_size: int) -> PPOWorkload:
    ctx = RankContext(rank=1 + comp_rank, world_size=1 + comp_size, component="rollout", comp_rank=comp_rank,
                      comp_size=comp_size, group=None, comm=None, device="cpu", seed=SEED, run_dir=Path("."),
                      mode="inprocess")
    return PPOWorkload(ctx, **SMALL)


def save(root: Path, step: int, trees: list[dict[str, Any]]) -> None:
    """One checkpoint of ``len(trees)`` ranks, each rank's tree written by its own writer."""
    shared: dict[str, Any] = {"slots": [None] * len(trees), "barrier": threading.Barrier(len(trees))}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            writer = CheckpointWriter(tiers_for(root), collective=ThreadCollective(r, len(trees), shared), threads=1)
            writer.save(step, trees[r], {"iteration": step})
            res = writer.wait()
            assert res is not None and res.ok, res
            writer.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(trees))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def stepped(trees: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Each rank loads its restored state, collects one rollout, and is checkpointed again."""
    out = []
    for j, tree in enumerate(trees):
        w = worker(j, len(trees))
        w.load_state_dict(tree["workload"])
        w.rollout(policy_version=step)
        out.append({"workload": w.state_dict(), "rng": tree["rng"], "iteration": step,
                    **({"pipeline": tree["pipeline"]} if "pipeline" in tree else {})})
    return out


def restore(root: Path, step: int, ranks: int, restart: int) -> list[tuple[dict[str, Any], Any]]:
    store = open_store(root)
    return [resize.load_for_rank(store, step, j, ranks, workload=worker(j, ranks), seed=SEED, restart_count=restart)
            for j in range(ranks)]


def check_new_rank(tree: dict[str, Any], info: Any, j: int, restart: int) -> None:
    """Rank j (which had no saved shard) got exactly the documented seeds."""
    fresh = list(range(j * K, j * K + K))
    assert info.fresh_envs == fresh and info.base_rank == 0
    w = tree["workload"]
    for i, g in enumerate(fresh):  # gymnasium's own reset with the documented env seed
        obs, _ = gym.make("CartPole-v1").reset(seed=documented(SEED, 0, g, restart) % (2**31 - 1))
        assert torch.equal(w["rollout.obs"][i], torch.as_tensor(obs, dtype=torch.float32)), (g, restart)
    assert torch.equal(w["rollout.ep_len"], torch.zeros(K, dtype=torch.int64))
    assert torch.equal(w["rng.rank"], torch.Generator().manual_seed(documented(SEED, 1, j, restart)).get_state())
    mine = capture_rng()
    try:
        restore_rng(tree["rng"])
        drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    finally:
        restore_rng(mine)
    s = documented(SEED, 2, j, restart)
    gen = torch.Generator().manual_seed(s)
    assert drawn == (random.Random(s).random(), float(np.random.RandomState(s % 2**32).rand()),
                     float(torch.rand(1, generator=gen)))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("seeds") / "rollout"
    trees = []
    for j in range(2):
        w = worker(j, 2)
        w.rollout(policy_version=0)
        trees.append({"workload": w.state_dict(), "rng": capture_rng(), "iteration": 3,
                      **({"pipeline": {"sent": {}}} if j == 0 else {})})
    save(root, 3, trees)
    return root


def test_2_to_3_to_2_to_3_gives_the_documented_seeds(two_ranks: Path, tmp_path: Path) -> None:
    saved2 = [open_store(two_ranks).load_rank(3, j)[0] for j in range(2)]
    # 2 -> 3 (restart 1): ranks 0 and 1 keep their own shard; rank 2 is seeded by the rule.
    grown = restore(two_ranks, 3, 3, restart=1)
    for j in range(2):
        assert grown[j][1].fresh_envs == [] and differences(flat(grown[j][0]), flat(saved2[j])) == []
    check_new_rank(*grown[2], j=2, restart=1)
    assert "pipeline" in grown[0][0] and "pipeline" not in grown[2][0]  # in-flight state stays on the leader

    # 3 -> 2 (restart 2): global envs 0..7 stay with ranks 0 and 1, rank 2's 8..11 are dropped, nothing seeded.
    three = tmp_path / "three" / "rollout"
    saved3 = stepped([t for t, _ in grown], 5)
    save(three, 5, saved3)
    shrunk = restore(three, 5, 2, restart=2)
    assert [(i.fresh_envs, i.dropped_envs, i.base_rank) for _, i in shrunk] == [([], 4, 0), ([], 0, 1)]
    for j in range(2):
        assert differences(flat(shrunk[j][0]), flat(open_store(three).load_rank(5, j)[0])) == []

    # 2 -> 3 again (restart 3): the new rank's seeds follow the restart count, not restart 1's.
    two_again = tmp_path / "two" / "rollout"
    save(two_again, 7, stepped([t for t, _ in shrunk], 7))
    regrown = restore(two_again, 7, 3, restart=3)
    check_new_rank(*regrown[2], j=2, restart=3)
    assert not torch.equal(regrown[2][0]["workload"]["rollout.obs"], grown[2][0]["workload"]["rollout.obs"])
    # Deterministic: the same checkpoint, counts, seed and restart count give the same state.
    assert differences(flat(restore(two_again, 7, 3, restart=3)[2][0]), flat(regrown[2][0])) == []

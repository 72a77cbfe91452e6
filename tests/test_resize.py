"""runtime/resize.py: a real 2-rank checkpoint of real PPO rollout workers (real gymnasium
CartPole, the real store and writer; two threads stand in for the two ranks'
all-gather) restored into 3 ranks, 1 rank and 2 ranks."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from hetrun.examples.ppo import PPOWorkload
from hetrun.runtime import resize
from hetrun.runtime.ckpt import open_store, tiers_for
from hetrun.runtime.ckpt.state import capture_rng
from hetrun.runtime.ckpt.writer import CheckpointWriter
from hetrun.runtime.context import RankContext

from hetrun.errors import CheckpointError
from tests.resume_compare import differences, flat

SMALL = {"num_envs": 4, "num_steps": 16, "update_epochs": 1, "num_minibatches": 2, "eval_episodes": 1}
SEED, STEP = 5, 3


class ThreadCollective:
    """All-gather between threads of this process (the ranks of this test)."""

    def __init__(self, rank: int, size: int, shared: dict[str, Any]) -> None:
        self.rank, self.size, self._s = rank, size, shared

    def allgather(self, value: Any) -> list[Any]:
        s = self._s
        s["slots"][self.rank] = value
        s["barrier"].wait()
        out = list(s["slots"])
        s["barrier"].wait()
        return out


def roller(rank: int, comp_rank: int = 0) -> PPOWorkload:
    ctx = RankContext(rank=rank, world_size=3, component="rollout", comp_rank=comp_rank, comp_size=2,
                      group=None, comm=None, device="cpu", seed=SEED, run_dir=Path("."), mode="inprocess")
    return PPOWorkload(ctx, **SMALL)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank checkpoint of two rollout workers that have stepped their envs."""
    root = tmp_path_factory.mktemp("resize") / "rollout"
    shared: dict[str, Any] = {"slots": [None, None], "barrier": threading.Barrier(2)}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            w = roller(1 + r, r)
            w.rollout(policy_version=0)
            writer = CheckpointWriter(tiers_for(root), collective=ThreadCollective(r, 2, shared), threads=1)
            writer.save(STEP, {"workload": w.state_dict(), "rng": capture_rng(), "iteration": STEP,
                               **({"pipeline": {"sent": {}}} if r == 0 else {})}, {"iteration": STEP})
            res = writer.wait()
            assert res is not None and res.ok, res
            writer.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return root


def load(root: Path, rank: int, ranks: int, restart: int = 1) -> tuple[dict[str, Any], Any]:
    return resize.load_for_rank(open_store(root), STEP, rank, ranks, workload=roller(9), seed=SEED,
                                restart_count=restart)


def test_same_rank_count_loads_each_rank_its_own_shard_exactly(saved: Path) -> None:
    for r in range(2):
        tree, info = load(saved, r, 2)
        assert info is None
        assert differences(flat(tree), flat(open_store(saved).load_rank(STEP, r)[0])) == []


def test_grow_keeps_saved_envs_by_global_index_and_seeds_the_new_ones(saved: Path) -> None:
    old = [open_store(saved).load_rank(STEP, r)[0]["workload"] for r in range(2)]
    trees = [load(saved, r, 3) for r in range(3)]
    for r in range(2):  # ranks with a saved shard: their own envs, streams and global RNG
        (tree, info), mine = trees[r], open_store(saved).load_rank(STEP, r)[0]
        assert info.base_rank == r and info.fresh_envs == []
        assert differences(flat(tree), flat(mine)) == []
    tree2, info2 = trees[2]
    assert info2.saved_ranks == 2 and info2.base_rank == 0 and info2.fresh_envs == [8, 9, 10, 11]
    w = tree2["workload"]
    assert w["rollout.obs"].shape == old[0]["rollout.obs"].shape
    assert torch.equal(w["rollout.ep_len"], torch.zeros(4, dtype=torch.int64))
    assert not torch.equal(w["rng.rank"], old[0]["rng.rank"])  # its own stream, not a copy of rank 0's
    assert flat(tree2["rng"]) != flat(trees[0][0]["rng"])
    assert "pipeline" not in tree2 and "pipeline" in trees[0][0]
    seeds = {tuple(e["state"]) for e in w["rollout.envs"]}
    assert len(seeds) == 4 and not seeds & {tuple(e["state"]) for o in old for e in o["rollout.envs"]}
    # Deterministic: the same checkpoint, counts, seed and restart count give the same state.
    again, _ = load(saved, 2, 3)
    assert differences(flat(again), flat(tree2)) == []
    # ...and another restart count gives other fresh environments.
    other, _ = load(saved, 2, 3, restart=2)
    assert "/workload/rollout.envs/0/rng/state/state" in differences(flat(other), flat(tree2))
    # The workload takes the state and steps on.
    w3 = roller(3, 2)
    w3.load_state_dict(w)
    assert w3.rollout(policy_version=1)["obs"].shape[0] == 4


def test_shrink_keeps_the_first_global_envs_and_counts_the_dropped(saved: Path) -> None:
    tree, info = load(saved, 0, 1)
    mine = open_store(saved).load_rank(STEP, 0)[0]
    assert info.dropped_envs == 4 and info.fresh_envs == []
    assert differences(flat(tree), flat(mine)) == []


def test_a_rank_with_more_envs_takes_them_from_the_next_rank(saved: Path) -> None:
    old = [open_store(saved).load_rank(STEP, r)[0]["workload"] for r in range(2)]

    class Wide(PPOWorkload):
        def envs_per_rank(self) -> int:
            return 8

    wide = Wide(roller(1).ctx, **{**SMALL, "num_envs": 8})
    tree, info = resize.load_for_rank(open_store(saved), STEP, 0, 1, workload=wide, seed=SEED, restart_count=1)
    assert info.fresh_envs == [] and info.dropped_envs == 0
    assert torch.equal(tree["workload"]["rollout.obs"], torch.cat([o["rollout.obs"] for o in old]))
    assert tree["workload"]["rollout.envs"] == old[0]["rollout.envs"] + old[1]["rollout.envs"]


def test_a_workload_that_does_not_declare_its_env_state_is_refused(saved: Path) -> None:
    class Plain:
        pass

    with pytest.raises(CheckpointError, match="resize_per_env_keys"):
        resize.load_for_rank(open_store(saved), STEP, 2, 3, workload=Plain(), seed=SEED, restart_count=1)


def test_seeds_are_distinct_per_index_and_restart() -> None:
    seeds = {resize.env_seed(0, g, r) for g in range(50) for r in range(3)}
    assert len(seeds) == 150
    assert resize.env_seed(0, 1, 1) != resize.stream_seed(0, 1, 1)

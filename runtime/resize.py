"""Restore a component's checkpoint into a different number of ranks (docs/CONTRACTS.md, "Resize").

A checkpoint of a component holds one shard per rank. When the component
restarts with the same number of ranks, each rank loads its own shard (the
exact path: bit-identical to an uninterrupted run). When the count changed
(``hetrun resubmit RUN --resize``), new rank ``j`` of ``n`` builds its state
from the ``m`` saved shards by one deterministic rule:

- **base shard**: old rank ``j`` when ``j < m``, else old rank 0. Everything
  the rules below do not name (weights, optimizer state, counters) comes from
  it: data-parallel learners hold replicated state, so any count works.
- **per-environment state** (the keys a workload lists in
  ``resize_per_env_keys``: tensors indexed by environment on dim 0, or lists
  of one entry per environment): the saved environments are numbered
  globally in rank order (old rank ``r`` holds the ``r``-th block). New rank
  ``j`` with ``k`` environments holds global indices ``j*k .. j*k+k-1``; each
  takes the saved state of that global index, and an index nobody saved
  (the job grew) starts a fresh environment seeded by
  ``env_seed(seed, g, restart_count)``. Saved environments past the new total
  (the job shrank) are dropped.
- **RNG streams**: a rank with a saved shard keeps its own streams (global
  python/numpy/torch and the workload's ``resize_rank_stream_keys``). A new
  rank (``j >= m``) gets fresh ones from ``stream_seed(seed, j, restart_count)``
  instead of copies of rank 0's, so no two ranks draw the same numbers.
- **in-flight pipeline state** (the sent policy versions consumers still
  need) lives on the component's leader, rank 0, which always exists; it is
  re-sent to whatever consumers the new plan has. Other ranks drop it.

Exactness across a resize is not promised (the data differs); determinism is:
the same checkpoint, counts, seed and restart count give the same state.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetrun.errors import CheckpointError

# Tags that keep the seed families apart (an env seed never equals a stream seed).
_ENV_TAG, _STREAM_TAG, _GLOBAL_TAG = 0, 1, 2


def _seed(*words: int) -> int:
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1)[0])


def env_seed(seed: int, global_env: int, restart_count: int) -> int:
    """The reset seed of a fresh environment at global index ``global_env``."""
    return _seed(seed, _ENV_TAG, global_env, restart_count)


def stream_seed(seed: int, comp_rank: int, restart_count: int, tag: int = _STREAM_TAG) -> int:
    """The seed of a new rank's RNG stream (component rank ``comp_rank``)."""
    return _seed(seed, tag, comp_rank, restart_count)


@dataclass(frozen=True)
class ResizeInfo:
    """How one rank's state was built, for the ``restore`` event."""

    saved_ranks: int
    ranks: int
    base_rank: int
    fresh_envs: list[int]  # global indices started fresh
    dropped_envs: int  # saved environments past the new total (this rank: only rank 0 counts them)

    def to_json(self) -> dict[str, Any]:
        return {"saved_ranks": self.saved_ranks, "ranks": self.ranks, "base_rank": self.base_rank,
                "fresh_envs": self.fresh_envs, "dropped_envs": self.dropped_envs}


def saved_ranks(store: Any, step: int) -> int:
    """How many ranks wrote ``step`` (its manifest's world size)."""
    for info in store.info():
        if info.step == step:
            return int(info.world_size)
    raise CheckpointError(f"no checkpoint for step {step}")


def load_for_rank(store: Any, step: int, rank: int, ranks: int, *, workload: Any, seed: int,
                  restart_count: int, into: Any = None) -> tuple[Any, ResizeInfo | None]:
    """This rank's checkpoint tree at ``step``: its own shard when the rank count is
    unchanged (``into`` as ``CheckpointStore.load_rank``), else built by the rule above."""
    m = saved_ranks(store, step)
    if m == ranks:
        return store.load_rank(step, rank, into=into)[0], None
    base_rank = rank if rank < m else 0
    tree = dict(store.load_rank(step, base_rank)[0])
    state = dict(tree.get("workload") or {})
    fresh, dropped = _resize_envs(store, step, m, rank, ranks, state, workload, seed, restart_count)
    if rank >= m:
        _fresh_streams(state, workload, seed, rank, restart_count)
        tree["rng"] = _fresh_global_rng(stream_seed(seed, rank, restart_count, _GLOBAL_TAG))
    if rank != 0:
        tree.pop("pipeline", None)
    tree["workload"] = state
    return tree, ResizeInfo(m, ranks, base_rank, fresh, dropped if rank == 0 else 0)


def _per_env_keys(workload: Any, state: dict[str, Any]) -> list[str]:
    keys = getattr(workload, "resize_per_env_keys", None)
    if keys is None:
        raise CheckpointError(
            f"{type(workload).__name__} does not declare how its state splits by environment "
            "(resize_per_env_keys), so it cannot restore into a different number of ranks",
            hint="resume with the rank counts the checkpoint was written with, or give the workload "
                 "resize_per_env_keys (docs/CONTRACTS.md, Resize)")
    return [k for k in keys if k in state]


def _count(value: Any, key: str) -> int:
    if hasattr(value, "shape"):
        return int(value.shape[0])
    if isinstance(value, list):
        return len(value)
    raise CheckpointError(f"per-environment state {key!r} is a {type(value).__name__}, "
                          "neither a tensor nor a list")


def _resize_envs(store: Any, step: int, m: int, rank: int, ranks: int, state: dict[str, Any],
                 workload: Any, seed: int, restart_count: int) -> tuple[list[int], int]:
    """Fill ``state``'s per-environment keys for this rank; returns (fresh global indices,
    saved environments dropped because the job shrank)."""
    keys = _per_env_keys(workload, state)
    if not keys:
        return [], 0
    k = int(workload.envs_per_rank())
    want = range(rank * k, rank * k + k)
    # Saved environments in global order: old rank r's block follows r-1's.
    pieces: dict[str, list[Any]] = {key: [] for key in keys}
    total = 0
    for r in range(m):
        shard = state if r == (rank if rank < m else 0) else store.load_rank(step, r)[0].get("workload") or {}
        n = _count(shard[keys[0]], keys[0])
        lo, hi = max(want.start, total), min(want.stop, total + n)
        if lo < hi:
            for key in keys:
                pieces[key].append(shard[key][lo - total:hi - total])
        total += n
        if total >= want.stop and rank != 0:
            break  # only rank 0 counts the dropped environments
    have = sum(_count(p, keys[0]) for p in pieces[keys[0]])
    fresh = list(range(want.start + have, want.stop))
    if fresh:
        made = workload.fresh_env_state([env_seed(seed, g, restart_count) for g in fresh])
        for key in keys:
            pieces[key].append(made[key])
    for key in keys:
        state[key] = _concat(pieces[key])
    return fresh, max(0, total - ranks * k)


def _concat(parts: list[Any]) -> Any:
    import torch

    if parts and isinstance(parts[0], torch.Tensor):
        return torch.cat(parts, dim=0)
    return [x for p in parts for x in p]


def _fresh_streams(state: dict[str, Any], workload: Any, seed: int, rank: int, restart_count: int) -> None:
    import torch

    for i, key in enumerate(getattr(workload, "resize_rank_stream_keys", ()) or ()):
        if key not in state:
            continue
        if not (isinstance(state[key], torch.Tensor) and state[key].dtype == torch.uint8):
            raise CheckpointError(f"rank stream {key!r} is not a torch generator state",
                                  hint="list only torch.Generator states in resize_rank_stream_keys")
        state[key] = torch.Generator().manual_seed(stream_seed(seed, rank, restart_count) + i).get_state()


def _fresh_global_rng(seed: int) -> dict[str, Any]:
    """python/numpy/torch global states seeded with ``seed``, in ``capture_rng``'s format
    (taken by seeding the globals and putting this process's own states back)."""
    import random

    import torch
    from hetrun.runtime.ckpt.state import capture_rng, restore_rng

    mine = capture_rng()
    try:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        return capture_rng()
    finally:
        with contextlib.suppress(CheckpointError):
            restore_rng(mine)

"""Byte-level training data from a corpus every machine has: the Python standard library.

The corpus is the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` in
sorted order (third-party ``site-packages`` excluded), read until a byte budget
is met. Every ``heldout_every``-th file goes to the held-out split, so train and
evaluation text never overlap. Nothing is downloaded.

Batches are random windows drawn with a generator seeded from
``(seed, iteration, micro, rank)``: the same arguments give the same batch on
any machine with the same Python, so a resumed run sees exactly the data it
would have seen, with no sampler state to checkpoint.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hetrun.errors import HetrunError

# Files this big are mostly generated tables; they would dominate a small budget.
_MAX_FILE_BYTES = 200_000


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted by path relative to the stdlib root."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise HetrunError(
            f"MoE LM corpus: the Python standard library directory {base} does not exist",
            hint="run with a regular CPython installation (sysconfig.get_paths()['stdlib'])",
        )
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = []
    # os.walk, pruning the skipped directories: every rank builds the corpus at
    # start-up, and Path.rglob walked all of site-packages (torch included) only
    # to drop it again: 0.54 CPU-s per rank, against ~0.05 s. Same file set
    # (symlinked directories are not entered by either).
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                if path.is_file():
                    files.append(path)
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


@dataclass(frozen=True)
class ByteCorpus:
    """Train and held-out bytes as uint8 tensors."""

    train: torch.Tensor
    heldout: torch.Tensor
    files: int

    @classmethod
    def from_stdlib(
        cls, budget_bytes: int = 4_000_000, heldout_every: int = 20, root: Path | None = None
    ) -> ByteCorpus:
        if budget_bytes < 10_000:
            raise HetrunError(
                f"MoE LM: corpus_bytes={budget_bytes} is too small to train on",
                hint="set workload_args.corpus_bytes to at least 10000 (default 4000000)",
            )
        if heldout_every < 2:
            raise HetrunError(
                f"MoE LM: heldout_every={heldout_every} leaves no training text",
                hint="set workload_args.heldout_every to 2 or more (default 20)",
            )
        train_parts: list[bytes] = []
        heldout_parts: list[bytes] = []
        total = 0
        used = 0
        for path in stdlib_files(root):
            if total >= budget_bytes:
                break
            data = path.read_bytes()
            if not data or len(data) > _MAX_FILE_BYTES:
                continue
            (heldout_parts if used % heldout_every == heldout_every - 1 else train_parts).append(
                data
            )
            used += 1
            total += len(data)
        train = np.frombuffer(b"".join(train_parts), dtype=np.uint8).copy()
        heldout = np.frombuffer(b"".join(heldout_parts), dtype=np.uint8).copy()
        if heldout.size < 4096 or train.size < 4096:
            raise HetrunError(
                f"MoE LM corpus: only {train.size} training and {heldout.size} held-out bytes "
                f"found under {root or sysconfig.get_paths()['stdlib']}",
                hint="raise workload_args.corpus_bytes or check the Python installation",
            )
        return cls(torch.from_numpy(train), torch.from_numpy(heldout), used)

    def sample(
        self, batch: int, seq: int, *, seed: int, iteration: int, micro: int, rank: int
    ) -> torch.Tensor:
        """``batch`` training windows of ``seq + 1`` bytes, int64 ``[batch, seq + 1]``."""
        state = np.random.SeedSequence([seed, iteration, micro, rank]).generate_state(2)
        gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        starts = torch.randint(0, self.train.numel() - seq - 1, (batch,), generator=gen)
        return _windows(self.train, starts, seq)

    def heldout_windows(self, count: int, seq: int) -> torch.Tensor:
        """``count`` evenly spaced held-out windows, int64 ``[count, seq + 1]`` (fixed set)."""
        span = self.heldout.numel() - seq - 1
        starts = torch.linspace(0, span, count).long()
        return _windows(self.heldout, starts, seq)


def _windows(data: torch.Tensor, starts: torch.Tensor, seq: int) -> torch.Tensor:
    offsets = torch.arange(seq + 1)
    return data[starts[:, None] + offsets[None, :]].long()

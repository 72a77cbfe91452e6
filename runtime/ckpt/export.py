"""Export a checkpoint out of hetrun's store so nobody is locked in.

- ``torch``: one file loadable with ``torch.load(path, weights_only=True)``.
- ``dcp``: a torch.distributed.checkpoint directory (``dcp.load`` into a state
  of the same structure).

A multi-rank checkpoint exports as ``{"rank0": state0, "rank1": ...}``
unless one rank is chosen. numpy arrays (e.g. numpy's RNG key) become torch
tensors, tuples become lists: plain ``weights_only`` loading accepts those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from hetrun.runtime.ckpt.store import CheckpointStore

from hetrun.errors import CheckpointError

FORMATS = ("torch", "dcp")


def _plain(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _dcp_keys(obj: Any) -> Any:
    # DCP flattens nested dicts by key path and wants string keys.
    if isinstance(obj, dict):
        return {str(k): _dcp_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return {str(i): _dcp_keys(v) for i, v in enumerate(obj)}
    return obj


def export(store: CheckpointStore, step: int, out: Path, fmt: str, rank: int | None = None) -> Path:
    if fmt not in FORMATS:
        raise CheckpointError(f"export format {fmt!r} is not supported", hint=f"use one of {', '.join(FORMATS)}")
    if step not in store.steps():
        raise CheckpointError(f"no checkpoint at step {step}",
                              hint="list them with `hetrun ckpt ls RUN`")
    manifest = next(t.read_manifest(step) for t in store.tiers if step in t.manifest_steps())
    world = int(manifest["world_size"])
    ranks = [rank] if rank is not None else list(range(world))
    for r in ranks:
        if not 0 <= r < world:
            raise CheckpointError(f"--rank {r} is out of range; checkpoint {step} has ranks 0..{world - 1}")
    from hetrun.runtime.ckpt.lossy import decode_state

    # A lossy checkpoint exports decoded (approximate) moments, as restore sees them.
    states = {f"rank{r}": _plain(decode_state(store.load_rank(step, r)[0])) for r in ranks}
    payload = states[f"rank{ranks[0]}"] if len(ranks) == 1 else states
    if out.exists() and fmt == "dcp" and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not empty", hint="choose a new output directory")
    try:
        if fmt == "torch":
            out.parent.mkdir(parents=True, exist_ok=True)
            torch.save(payload, out)
        else:
            import torch.distributed.checkpoint as dcp

            out.mkdir(parents=True, exist_ok=True)
            dcp.save(_dcp_keys(payload), checkpoint_id=str(out))
    except OSError as exc:
        raise CheckpointError(f"cannot write export to {out}: {exc}") from exc
    return out

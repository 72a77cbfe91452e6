"""hetrun's checkpoint store: content-addressed, incremental, asynchronous, verified.

- ``CheckpointWriter(tiers, collective=..., keep=...)``: ``save(step, state)``
  snapshots and writes in the background; ``wait()``; ``close()``.
- ``CheckpointStore(tiers)``: ``restore(collective)`` (newest checkpoint every
  rank can verify, with fallback), ``load_rank``, ``info``, ``verify``.
- ``Tier(path, name)``: one directory of the store ("local" or "shared").
- ``open_store(directory, local_dir=None)``: the tiers of a run's store.

Nothing is pickled; loading never executes code.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetrun.runtime.ckpt.objects import Tier
    from hetrun.runtime.ckpt.store import CheckpointInfo, CheckpointStore, RestoreResult, gc, retain

# Imported on first use (PEP 562): store/objects pull in the codec, torch and
# numpy, and the CLI's light path (hetrun plan's object-store check,
# runtime/ckpt/object_preflight.py) imports modules of this package.
_LAZY = {"Tier": "objects", "CheckpointInfo": "store", "CheckpointStore": "store",
         "RestoreResult": "store", "gc": "store", "retain": "store"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tiers_for(directory: str | os.PathLike[str], local_dir: str | os.PathLike[str] | None = None) -> list[Tier]:
    """Tiers in restore-preference order: node-local first (fast), then shared."""
    from hetrun.runtime.ckpt.objects import Tier

    tiers = []
    if local_dir:
        tiers.append(Tier(local_dir, "local"))
    tiers.append(Tier(directory, "shared"))
    return tiers


def open_store(directory: str | os.PathLike[str], local_dir: str | os.PathLike[str] | None = None,
               *, threads: int = 2) -> CheckpointStore:
    from hetrun.runtime.ckpt.store import CheckpointStore

    return CheckpointStore(tiers_for(directory, local_dir), threads=threads)


__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "RestoreResult",
    "Tier",
    "gc",
    "open_store",
    "retain",
    "tiers_for",
]

"""PyTorch Lightning on hetrun's checkpoint store, and on its agreed stop.

- ``HetrunCheckpointIO``: a Lightning ``CheckpointIO`` plugin. Each
  ``save_checkpoint(checkpoint, path)`` goes into a content-addressed,
  incremental store (``<dir of path>/hetrun-store``; unchanged chunks are
  not rewritten, the write runs in the background, nothing is pickled), and
  ``path`` itself becomes a small JSON pointer to the stored step, written
  atomically once that step is committed (so Lightning never finds a pointer
  to a checkpoint that is not complete; an ``hpc_ckpt_<n>.ckpt`` save, after
  which Lightning's SLURM handler requeues at once, waits for it). ``load_checkpoint(path)`` follows
  the pointer and verifies what it reads. The python/numpy/torch RNG states
  travel with the checkpoint (``rng=True``) and are restored on load.
- ``HetrunRequeue(run)``: a callback that logs every training batch
  (``run.log``: step and loss, for ``hetrun report``) and asks
  ``run.should_stop`` after it (all ranks agree on one step); then it saves
  ``<default_root_dir>/hpc_ckpt_<n>.ckpt`` through the trainer, waits for it
  and leaves through ``run.exit_for_requeue()``. The file name is
  Lightning's own: under SLURM its ``SLURMEnvironment`` finds it on the
  requeued run (``ckpt_path=None`` -> "hpc"); elsewhere pass
  ``ckpt_path=hpc_resume_path(root)``. Lightning's own SIGUSR1 handler for
  auto-requeue is chained with hetrun's (it keeps a handler that was there).

Lightning's saves happen on global rank 0 only (the state is replicated), so
the store here has one writer (``SoloCollective``). For an exact mid-epoch
resume the train dataloader must be resumable (``state_dict`` /
``load_state_dict``): Lightning warns otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from hetrun.runtime.ckpt.objects import atomic_write
from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from pytorch_lightning.callbacks import Callback

from hetrun.errors import CheckpointError

POINTER_FORMAT = "hetrun-lightning-pointer/1"
STORE_DIR = "hetrun-store"
_HPC_NAME = re.compile(r"hpc_ckpt_(\d+)\.ckpt")
RNG_KEY = "hetrun_rng"


class HetrunCheckpointIO(CheckpointIO):
    def __init__(self, *, keep: int = 5, rng: bool = True) -> None:
        self.keep = keep
        self.rng = rng
        self._writers: dict[Path, Any] = {}
        self._last_seq: dict[Path, int] = {}
        self._pending: list[tuple[Path, Path, dict[str, Any]]] = []  # saved, pointer not yet written

    def _writer(self, store_dir: Path) -> Any:
        from hetrun.runtime.ckpt import tiers_for
        from hetrun.runtime.ckpt.writer import CheckpointWriter

        if store_dir not in self._writers:
            self._writers[store_dir] = CheckpointWriter(tiers_for(store_dir), keep=self.keep)
        return self._writers[store_dir]

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        from hetrun.runtime.ckpt import open_store
        from hetrun.runtime.ckpt.state import capture_rng

        if storage_options is not None:
            raise TypeError(f"HetrunCheckpointIO takes no storage_options (got {storage_options!r})")
        path = Path(path)
        store_dir = path.parent / STORE_DIR
        writer = self._writer(store_dir)
        # A sequence number, not global_step: Lightning may save twice at one step (last + top-k).
        if store_dir not in self._last_seq:
            self._last_seq[store_dir] = max(open_store(store_dir).steps(), default=0)
        seq = self._last_seq[store_dir] = self._last_seq[store_dir] + 1
        tree = {**checkpoint, RNG_KEY: capture_rng()} if self.rng else checkpoint
        writer.save(seq, tree, {"lightning_path": path.name, "global_step": checkpoint.get("global_step")})
        self._pending.append((path, store_dir, {
            "format": POINTER_FORMAT, "store": STORE_DIR, "step": seq,
            "global_step": checkpoint.get("global_step"), "epoch": checkpoint.get("epoch")}))
        if _HPC_NAME.fullmatch(path.name):
            # Lightning's SLURM handler requeues right after this returns: the
            # pointer it resumes from must name a committed checkpoint.
            self.wait()
        else:
            self._publish()

    def _publish(self) -> list[str]:
        """Write the pointers of committed saves (a pointer never names a step
        that is not in the store); returns the errors of failed ones."""
        errors, still = [], []
        for path, store_dir, pointer in self._pending:
            done = {r.step: r for r in self._writers[store_dir].results}
            res = done.get(pointer["step"])
            if res is None:
                still.append((path, store_dir, pointer))
            elif res.ok:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, [json.dumps(pointer).encode()], durable=True)
            else:
                errors.append(f"{path.name}: {res.error}")
        self._pending = still
        return errors

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None) -> dict[str, Any]:
        from hetrun.runtime.ckpt import open_store
        from hetrun.runtime.ckpt.state import restore_rng

        self.wait()  # a checkpoint saved by this process may still be in flight
        pointer = read_pointer(Path(path))
        store_dir = Path(path).parent / pointer["store"]
        value, _meta, _tier = open_store(store_dir).load_rank(int(pointer["step"]), 0)
        if not isinstance(value, dict):
            raise CheckpointError(f"{path}: step {pointer['step']} of {store_dir} is not a Lightning checkpoint")
        rng = value.pop(RNG_KEY, None)
        if self.rng and rng is not None:
            restore_rng(rng)
        if map_location is not None:
            value = _to_device(value, map_location)
        return value

    def remove_checkpoint(self, path: Any) -> None:
        # The pointer goes; the store's retention (keep) and gc reclaim the chunks.
        self._pending = [p for p in self._pending if p[0] != Path(path)]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def wait(self) -> None:
        """Block until every checkpoint in flight is committed and its pointer
        written; raise if one failed."""
        for writer in self._writers.values():
            writer.wait()
        errors = self._publish()
        if errors:
            raise CheckpointError("checkpoint not written: " + "; ".join(errors),
                                  hint="the previous checkpoints are intact; see the error for the cause")

    def teardown(self) -> None:
        self.wait()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def read_pointer(path: Path) -> dict[str, Any]:
    try:
        pointer = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not a hetrun checkpoint pointer ({exc})",
                              hint="it was written by another CheckpointIO: load it without "
                                   "HetrunCheckpointIO, or import it") from exc
    if not isinstance(pointer, dict) or pointer.get("format") != POINTER_FORMAT:
        raise CheckpointError(f"{path}: unknown pointer format {pointer.get('format') if isinstance(pointer, dict) else pointer!r}",
                              hint=f"expected {POINTER_FORMAT}")
    store = pointer.get("store")
    if not isinstance(store, str) or "/" in store or store in ("", ".", ".."):
        raise CheckpointError(f"{path}: store {store!r} is not a directory name next to the pointer")
    if not isinstance(pointer.get("step"), int):
        raise CheckpointError(f"{path}: step {pointer.get('step')!r} is not an integer")
    return pointer


def _to_device(tree: Any, device: Any) -> Any:
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_device(v, device) for v in tree)
    return tree


def hpc_resume_path(root: str | os.PathLike[str]) -> str | None:
    """The newest ``hpc_ckpt_<n>.ckpt`` under ``root`` (Lightning's naming), or None."""
    versions = [int(m.group(1)) for p in Path(root).glob("hpc_ckpt_*.ckpt")
                if (m := _HPC_NAME.fullmatch(p.name))]
    return str(Path(root) / f"hpc_ckpt_{max(versions)}.ckpt") if versions else None


class HetrunRequeue(Callback):
    """The agreed stop for a Lightning fit (see the module docstring)."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # global_step has counted this batch's optimizer step: the step just done.
        step = trainer.global_step - 1
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.run.log(step, **({"loss": float(loss)} if loss is not None and loss.numel() == 1 else {}))
        if not self.run.should_stop(step):
            return
        root = trainer.default_root_dir
        latest = hpc_resume_path(root)
        version = int(Path(latest).stem.rsplit("_", 1)[1]) + 1 if latest else 1
        trainer.save_checkpoint(str(Path(root) / f"hpc_ckpt_{version}.ckpt"))
        io = trainer.strategy.checkpoint_io
        if isinstance(io, HetrunCheckpointIO):
            io.wait()
        self.run.exit_for_requeue()

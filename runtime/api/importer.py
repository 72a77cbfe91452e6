"""Seed a run's checkpoint store from a torch.save file or a DCP directory (``hetrun ckpt import``).

The imported state is written by the run API's own save path (``Run.save``), by
``ranks`` real processes connected over gloo as torchrun would connect them, so
``run.restore({...})`` of a script with that many ranks finds it like any checkpoint
of its own: every top-level key of the file becomes one name of the restore dict
(``{"model": ..., "optim": ...}``), and ``step`` (the last step done, as
examples/ddp_train.py saves it) makes restore return ``step + 1``.

Safety: a torch.save file is read with ``torch.load(weights_only=True)`` only (tensors,
containers and plain values: no code runs). A DCP directory's ``.metadata`` is a
pickle; reading it could run code, so it is refused unless the caller passes
``trust_pickle`` (``--trust-pickle``). A torch.save file holds no RNG states: the
checkpoint gets those of generators seeded with ``seed``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hetrun.errors import CheckpointError

STEP_KEY = "step"


class Held:
    """A plain value (a state dict, a number) as a Stateful object for the run API."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, value: Any) -> None:
        self.value = value


def _torch_load(path: Path) -> Any:
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: torch.load(weights_only=True) refused it ({str(exc).splitlines()[0]})",
            hint="it holds objects other than tensors and plain containers; save state_dict()s instead "
                 "(hetrun never runs a full unpickle)") from exc
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a readable torch.save file ({exc})") from exc


def load_source(path: Path, *, trust_pickle: bool = False) -> dict[str, Any]:
    """The state dict in ``path``: a torch.save file, or a DCP checkpoint directory."""
    if path.is_dir():
        if not (path / ".metadata").is_file():
            raise CheckpointError(f"{path} is a directory without a DCP .metadata file",
                                  hint="pass a torch.save file or a torch.distributed.checkpoint directory")
        if not trust_pickle:
            raise CheckpointError(
                f"{path} is a torch.distributed.checkpoint directory: its .metadata is a Python pickle, "
                "and unpickling a file can run arbitrary code",
                hint="if you trust where it came from, pass --trust-pickle; else convert it to a "
                     "torch.save file of tensors where it was made")
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            flat = Path(tmp) / "state.pt"
            dcp_to_torch_save(str(path), str(flat))
            state = _torch_load(flat)
    elif path.is_file():
        state = _torch_load(path)
    else:
        raise CheckpointError(f"{path} does not exist")
    if not isinstance(state, dict) or not state or not all(isinstance(k, str) for k in state):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a dict of named states",
                              hint='save e.g. {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}')
    return state


def split_step(state: dict[str, Any], step: int | None, source: Path) -> tuple[dict[str, Any], int]:
    """(the states to store, the last step done): ``step`` given wins over the file's ``step``."""
    rest = {k: v for k, v in state.items() if k != STEP_KEY}
    if step is None:
        raw = state.get(STEP_KEY)
        if hasattr(raw, "item"):
            raw = raw.item()
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise CheckpointError(f"{source} has no integer {STEP_KEY!r} entry (the last step done)",
                                  hint="pass --step N: the resumed script starts at step N + 1")
        step = raw
    if step < 0:
        raise CheckpointError(f"step {step} is negative", hint="--step is the last step done, 0 or more")
    if not rest:
        raise CheckpointError(f"{source} holds nothing but {STEP_KEY!r}")
    return rest, step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def import_into(source: Path, run_dir: Path, *, component: str, ranks: int, step: int | None,
                trust_pickle: bool = False, seed: int = 0, timeout_s: float = 600) -> int:
    """Write ``source``'s state as the checkpoint of ``ranks`` ranks of ``component`` in
    ``run_dir``; returns the step a restore will start from."""
    state, done = split_step(load_source(source, trust_pickle=trust_pickle), step, source)
    if ranks < 1:
        raise CheckpointError(f"--ranks {ranks}: a run has at least one rank")
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "state.pt"  # written by us from tensors and containers: weights_only reads it
        import torch

        torch.save(state, flat)
        port = _free_port()
        base = {k: v for k, v in os.environ.items()
                if k not in ("HETRUN_RUN_DIR", "HETRUN_COMPONENT", "SLURM_JOB_ID", "SLURM_STEP_ID")}
        procs = []
        for rank in range(ranks):
            env = {**base, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            argv = [sys.executable, "-m", "hetrun.runtime.api.importer", str(flat), str(run_dir),
                    "--component", component, "--step", str(done), "--seed", str(seed)]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    failed = [(i, p.returncode, out) for i, (p, out) in enumerate(zip(procs, outputs, strict=True)) if p.returncode]
    if failed:
        rank, code, out = failed[0]
        last = (out.strip().splitlines() or ["(no output)"])[-1]
        raise CheckpointError(f"import rank {rank} exited {code}: {last}")
    return done + 1


def _worker(argv: list[str] | None = None) -> int:
    """One rank of the import: load the flat state, save it through the run API."""
    p = argparse.ArgumentParser(prog="python -m hetrun.runtime.api.importer")
    p.add_argument("state", type=Path)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--component", required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import random

    import numpy as np
    import torch
    import torch.distributed as dist

    import hetrun

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    state = _torch_load(args.state)
    run = hetrun.attach(run_dir=args.run_dir, component=args.component)
    if run.world_size > 1:
        dist.init_process_group("gloo")
    objs = {k: v if isinstance(v, torch.Tensor) else Held(v) for k, v in state.items()}
    info = run.save(args.step, objs, wait=True)
    if info.get("ok") is False:
        sys.stderr.write(f"hetrun: import: the checkpoint write failed: {info.get('error')}\n")
        return 1
    run.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker())

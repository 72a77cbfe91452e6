"""Lightning on hetrun: a real small LightningModule fits on CPU with
HetrunCheckpointIO (checkpoints in hetrun's store, the .ckpt file a JSON
pointer) and HetrunRequeue (hetrun's agreed stop). SIGUSR1 at a random step
mid-epoch: it saves Lightning's hpc_ckpt_<n>.ckpt and exits 85; the rerun
resumes from it (Lightning's own hpc naming) and ends bit-identical to an
uninterrupted fit."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from setup_tools import import_or_require

import_or_require("pytorch_lightning", "pytorch-lightning (pip, the lightning extra)")

from hetrun.runtime.api.lightning import HetrunCheckpointIO, hpc_resume_path, read_pointer  # noqa: E402 (after the package check)

from hetrun.errors import CheckpointError  # noqa: E402 (after the package check)
from tests.api_helpers import EXIT_REQUEUE, assert_bit_identical, events, run_once  # noqa: E402 (after the package check)

pytestmark = [pytest.mark.slow]
FIT = Path(__file__).with_name("lightning_fit.py")
STEPS = 30


def _fit(root: Path, step_time: float, stop_after: int | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(FIT), str(root), str(STEPS), str(step_time)]
    return run_once(cmd, root / "run", stop_rank=None if stop_after is None else 0, stop_after=stop_after or 0)


def test_lightning_fit_stopped_by_a_signal_mid_epoch_resumes_bit_identical(shared_tmp: Path) -> None:
    import torch

    full = _fit(shared_tmp / "full", 0.0)
    assert full.returncode == 0, full.stdout
    root = shared_tmp / "stopped"
    stop_after = random.Random().randrange(3, STEPS - 8)
    first = _fit(root, 0.1, stop_after)
    assert first.returncode == EXIT_REQUEUE, first.stdout
    hpc = hpc_resume_path(root)
    assert hpc is not None and Path(hpc).name == "hpc_ckpt_1.ckpt", first.stdout
    pointer = read_pointer(Path(hpc))
    assert pointer["global_step"] > stop_after  # the agreed step, after the signal
    second = _fit(root, 0.0)
    assert second.returncode == 0, second.stdout
    final = torch.load(root / "final.pt", weights_only=True)
    assert_bit_identical(final, torch.load(shared_tmp / "full" / "final.pt", weights_only=True))
    exits = [e["code"] for e in events(root / "run") if e["ev"] == "exit"]
    assert exits == [EXIT_REQUEUE, 0]


def test_checkpoint_io_round_trip_and_clear_errors(tmp_path: Path) -> None:
    import torch

    io = HetrunCheckpointIO()
    ckpt = {"state_dict": {"w": torch.arange(6.0).reshape(2, 3)}, "global_step": 7, "epoch": 1,
            "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 2}}}}, "optimizer_states": [{"state": {}}]}
    io.save_checkpoint(ckpt, tmp_path / "a.ckpt")
    io.save_checkpoint({**ckpt, "global_step": 8}, tmp_path / "b.ckpt")
    io.teardown()
    assert json.loads((tmp_path / "b.ckpt").read_text())["step"] == 2
    back = HetrunCheckpointIO(rng=False).load_checkpoint(tmp_path / "a.ckpt")
    assert torch.equal(back["state_dict"]["w"], ckpt["state_dict"]["w"]) and back["global_step"] == 7
    assert back["loops"] == ckpt["loops"]
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    torch.save({"x": 1}, tmp_path / "plain.ckpt")
    with pytest.raises(CheckpointError, match="not a hetrun checkpoint pointer"):
        io.load_checkpoint(tmp_path / "plain.ckpt")
    with pytest.raises(CheckpointError, match="cannot be stored without pickle"):
        HetrunCheckpointIO().save_checkpoint({"hparams": object()}, tmp_path / "c.ckpt")

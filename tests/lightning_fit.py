"""A small Lightning fit on CPU under hetrun's agreed stop (used by
tests/test_lightning.py): HetrunCheckpointIO + HetrunRequeue, a resumable
train dataloader, resume from Lightning's hpc_ckpt naming.

    python tests/lightning_fit.py ROOT MAX_STEPS STEP_TIME
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from hetrun.runtime.api.lightning import HetrunCheckpointIO, HetrunRequeue, hpc_resume_path

import hetrun


class Batches:
    """A resumable dataloader: batch i of epoch e is a pure function of (e, i)."""

    def __init__(self, n_batches: int = 8, batch: int = 16, dim: int = 8) -> None:
        self.n, self.batch, self.dim = n_batches, batch, dim
        self.epoch, self.index = 0, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # type: ignore[no-untyped-def]
        while self.index < self.n:
            g = torch.Generator().manual_seed(1000 * self.epoch + self.index)
            x = torch.randn(self.batch, self.dim, generator=g)
            self.index += 1
            yield x, x.sum(dim=1, keepdim=True) * 0.5
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class Regressor(pl.LightningModule):
    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.step_time = step_time

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        time.sleep(self.step_time)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)}


def main() -> None:
    root, max_steps, step_time = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    run = hetrun.attach(run_dir=root / "run")
    torch.manual_seed(0)
    model = Regressor(step_time)
    trainer = pl.Trainer(max_steps=max_steps, default_root_dir=str(root), accelerator="cpu", devices=1,
                         plugins=[HetrunCheckpointIO()], callbacks=[HetrunRequeue(run)], logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=Batches(), ckpt_path=hpc_resume_path(root))
    torch.save(model.state_dict(), root / "final.pt")
    run.close()


if __name__ == "__main__":
    main()

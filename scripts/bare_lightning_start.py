"""The start-up reference of Lightning alone: the plain floor's first training step (its network, data, Adam and
one-cycle schedule, scripts/plain_floor.py) inside a bare Lightning Trainer (no logger, checkpoint, progress bar,
summary or validation), with no Hydra or project import. What any Lightning program pays before its first step:
Lightning's import (and what it imports) and the Trainer's set-up.

Usage: python scripts/bare_lightning_start.py DATA_DIR SEED   (prints `first step done at <time.time()>`, exits)
"""

import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from plain_floor import HOLD_OUT, HOLD_OUT_SEED, RECIPE, as_input, jitter, network, read_idx
from torch.utils.data import DataLoader, TensorDataset


class FloorStep(pl.LightningModule):
    def __init__(self, data_dir: str, seed: int) -> None:
        super().__init__()
        self.r, self.data_dir, self.seed = RECIPE, data_dir, seed
        self.layout = torch.channels_last if self.r["channels_last"] else torch.contiguous_format
        self.net = network(self.r).to(memory_format=self.layout)
        self.generator = torch.Generator().manual_seed(seed)

    def train_dataloader(self) -> DataLoader:
        images, labels = read_idx(Path(self.data_dir) / "MNIST" / "raw", "train")
        hold_out = min(HOLD_OUT, len(labels) // 6)  # as the floor holds out of a small split
        keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(HOLD_OUT_SEED))[hold_out:]
        chosen = keep[torch.randperm(len(keep), generator=self.generator)[: self.r["batch"]]]
        # The first step's batch: what comes after it is not timed.
        return DataLoader(TensorDataset(images[chosen], labels[chosen]), batch_size=self.r["batch"])

    def training_step(self, batch: tuple, index: int) -> torch.Tensor:
        images, labels = batch
        x = jitter(images, self.r["shift"], self.generator) if self.r["shift"] else images
        return F.cross_entropy(self.net(as_input(x, self.layout)), labels, label_smoothing=self.r["smoothing"])

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.r["peak_lr"])
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, self.r["peak_lr"], total_steps=429, pct_start=self.r["warmup"]
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class FirstStep(pl.Callback):
    def on_train_batch_end(self, *args: object) -> None:
        print(f"first step done at {time.time():.3f}", flush=True)
        sys.exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/bare_lightning_start.py DATA_DIR SEED")
    torch.manual_seed(int(sys.argv[2]))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[FirstStep()],
    )  # fmt: skip
    trainer.fit(FloorStep(sys.argv[1], int(sys.argv[2])))

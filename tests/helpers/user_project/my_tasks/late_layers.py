"""A module as Lightning's docs write one for large models: its layers are built in `configure_model` (on the
device, sharded or not, by whatever strategy runs it), its metrics logged as `val_loss` and `test_loss`. Each
rank writes its full weights at the end of training, to compare ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn


class LateLayers(pl.LightningModule):
    def __init__(self, in_features: int, hidden: int = 16, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net: nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is not None:  # Lightning calls it once per stage
            return
        self.net = nn.Sequential(
            nn.Linear(self.hparams.in_features, self.hparams.hidden), nn.Tanh(), nn.Linear(self.hparams.hidden, 1)
        )

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch["x"]).squeeze(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def on_train_end(self) -> None:
        from torch.distributed.tensor import DTensor

        full = {
            name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu()
            for name, p in self.named_parameters()
        }
        folder = os.environ.get("WEIGHTS_DIR")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            torch.save(full, Path(folder) / f"rank{self.global_rank}.pt")

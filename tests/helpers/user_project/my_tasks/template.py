"""A module as lightning-hydra-template writes them: Hydra builds its network and a `_partial_` optimizer."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn


class TemplateModule(pl.LightningModule):
    def __init__(self, net: nn.Module, optimizer: partial, scheduler: partial | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1).float())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        self.log("val/acc", (self(x).argmax(1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = self.hparams.optimizer(params=self.parameters())
        if self.hparams.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.hparams.scheduler(optimizer=optimizer)}

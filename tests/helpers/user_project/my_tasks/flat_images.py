"""A module as Lightning's MNIST examples write one: a linear layer over the flattened image, the batch's
images used as they come (no cast of its own), accuracy logged in validation."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn


class FlatImages(pl.LightningModule):
    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        features = 1
        for size in input_shape:
            features *= size
        self.layer = nn.Linear(features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class AveragedFlatImages(FlatImages):
    """The same layer, with an exponential moving average of its weights updated after every step in the module's
    own `on_train_batch_end`, as an EMA is often written (a buffer: saved in checkpoints)."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10, lr: float = 1e-2,
                 decay: float = 0.5) -> None:  # fmt: skip
        super().__init__(input_shape, num_classes, lr)
        self.decay = decay
        self.register_buffer("ema", torch.zeros_like(self.layer.weight))

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        self.ema.mul_(self.decay).add_(self.layer.weight.detach(), alpha=1 - self.decay)

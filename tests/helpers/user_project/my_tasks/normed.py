"""A user's module with BatchNorm layers: what 1-vs-N process training advises for a module of one's own."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from my_tasks.regression import Regressor


class NormedRegressor(Regressor):
    """The regression MLP with a BatchNorm after each of its hidden layers."""

    def __init__(self, in_features: int, hidden: int = 32, lr: float = 1e-3, dropout: float = 0.1) -> None:
        super().__init__(in_features, hidden, lr, dropout)
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.BatchNorm1d(hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.Tanh(),
            nn.Linear(hidden, 1),
        )  # fmt: skip


class ManualNormedRegressor(NormedRegressor):
    """The same network trained by manual optimization (`automatic_optimization = False`), as a GAN is."""

    def __init__(self, in_features: int, hidden: int = 32, lr: float = 1e-3, dropout: float = 0.1) -> None:
        super().__init__(in_features, hidden, lr, dropout)
        self.automatic_optimization = False

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        loss = F.mse_loss(self(batch["x"]), batch["y"])
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        self.log("train/mse", loss)
        return loss

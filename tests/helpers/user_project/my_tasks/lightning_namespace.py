"""A module, a data module and a callback written against the `lightning` package, as Lightning's own docs
write them (`import lightning as L`, `lightning.pytorch.*`), no hydralight or pytorch_lightning import."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import nn

from my_tasks.regression import RegressionData


class LitRegressor(L.LightningModule):
    """The regression task of `my_tasks.regression`, as a `lightning` module."""

    def __init__(self, in_features: int, hidden: int = 16, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        self.log("train/mse", loss)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/mse", F.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"]))

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("test/mse", F.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class LitPoints(L.LightningDataModule):
    """The points of `my_tasks.regression` behind a `lightning` data module."""

    sizes = ("in_features",)

    def __init__(self, in_features: int = 4, batch_size: int = 32) -> None:
        super().__init__()
        self.in_features = in_features
        self.points = RegressionData(in_features=in_features, batch_size=batch_size)

    def setup(self, stage: str | None = None) -> None:
        self.points.setup(stage)

    def train_dataloader(self):  # noqa: ANN201
        return self.points.train_dataloader()

    def val_dataloader(self):  # noqa: ANN201
        return self.points.val_dataloader()

    def test_dataloader(self):  # noqa: ANN201
        return self.points.test_dataloader()


class StepCounter(Callback):
    """Counts the training steps it saw into `<run_dir>/steps.json`."""

    def __init__(self, run_dir: str) -> None:
        self.path, self.steps = Path(run_dir) / "steps.json", 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.steps += 1

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.path.write_text(
            json.dumps({"steps": self.steps, "module_is_lightning": isinstance(pl_module, L.LightningModule)})
        )

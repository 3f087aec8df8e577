"""Regression with its own loss and metric, dict batches, and a data module that states its input size."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionData(pl.LightningDataModule):
    """y = sin(x . w) + noise, for x in [-1, 1]^in_features; 80/10/10 train/val/test."""

    sizes = ("in_features",)

    def __init__(self, n: int = 640, in_features: int = 4, noise: float = 0.05, batch_size: int = 32,
                 num_workers: int = 0, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.n, self.in_features, self.noise = n, in_features, noise
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed

    def setup(self, stage: str | None = None) -> None:
        gen = torch.Generator().manual_seed(1234)
        x = torch.rand(self.n, self.in_features, generator=gen) * 2 - 1
        w = torch.linspace(0.5, 1.5, self.in_features)
        y = torch.sin(2 * x @ w) + self.noise * torch.randn(self.n, generator=gen)
        a, b = int(self.n * 0.8), int(self.n * 0.9)
        self.parts = {"train": Points(x[:a], y[:a]), "val": Points(x[a:b], y[a:b]), "test": Points(x[b:], y[b:])}

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.parts["train"], batch_size=self.batch_size, shuffle=True, drop_last=True, generator=gen)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.parts["val"], batch_size=64)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.parts["test"], batch_size=64)


class TwoValidationSets(RegressionData):
    """The same points, validated on two sets (`val_dataloader` returns a list): the validation and the test split."""

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(self.parts[part], batch_size=64) for part in ("val", "test")]


class TwoPredictSets(RegressionData):
    """The same points, predicted on two sets (`predict_dataloader` returns a list)."""

    def predict_dataloader(self) -> list[DataLoader]:
        return [DataLoader(self.parts[part], batch_size=64) for part in ("val", "test")]


class PointsWithoutTest(RegressionData):
    """The same points, with no test set (a data set whose test labels are held back)."""

    test_dataloader = None  # type: ignore[assignment]


class TrainAndValOnly(pl.LightningDataModule):
    """A data module that never defines `test_dataloader`."""

    sizes = ("in_features",)

    def __init__(self, in_features: int = 4, batch_size: int = 32) -> None:
        super().__init__()
        self.points = RegressionData(in_features=in_features, batch_size=batch_size)
        self.in_features = in_features

    def setup(self, stage: str | None = None) -> None:
        self.points.setup(stage)

    def train_dataloader(self) -> DataLoader:
        return self.points.train_dataloader()

    def val_dataloader(self) -> DataLoader:
        return self.points.val_dataloader()


class Regressor(pl.LightningModule):
    """An MLP trained with mean squared error; logs train/mse, val/mse and test/mse."""

    def __init__(self, in_features: int, hidden: int = 32, lr: float = 1e-3, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self(batch["x"]), batch["y"])
        self.log("train/mse", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/mse", F.mse_loss(self(batch["x"]), batch["y"]), prog_bar=True)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("test/mse", F.mse_loss(self(batch["x"]), batch["y"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class EpochEndRegressor(Regressor):
    """The same regressor measured as Lightning's docs measure at an epoch's end: each step's errors kept, their
    mean logged in `on_validation_epoch_end` and `on_test_epoch_end`, without sync_dist; and a count rank 0 alone
    logs there."""

    def __init__(self, in_features: int, hidden: int = 32, lr: float = 1e-3, dropout: float = 0.1) -> None:
        super().__init__(in_features, hidden, lr, dropout)
        self.errors: list[torch.Tensor] = []

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.errors.append((self(batch["x"]) - batch["y"]) ** 2)

    test_step = validation_step

    def on_validation_epoch_end(self) -> None:
        self.log("val/mse", torch.cat(self.errors).mean())
        if self.global_rank == 0:
            self.log("val/rank0_samples", float(len(torch.cat(self.errors))))
        self.errors.clear()

    def on_test_epoch_end(self) -> None:
        self.log("test/mse", torch.cat(self.errors).mean())
        self.errors.clear()


class TwoSetRegressor(Regressor):
    """The regressor validated on several loaders: each value is logged under `<name>/dataloader_idx_<N>`."""

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)


class PredictingRegressor(Regressor):
    """The regressor with a predict step, as Lightning's docs write one: no dataloader_idx."""

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch["x"])


class CountingRegressor(Regressor):
    """The regressor with an argument that chooses what it reports, not what it is (`how_it_runs`): with
    `count_samples` it logs how many samples its test saw."""

    how_it_runs = ("count_samples",)

    def __init__(self, in_features: int, hidden: int = 32, lr: float = 1e-3, dropout: float = 0.1,
                 count_samples: bool = False) -> None:  # fmt: skip
        super().__init__(in_features, hidden, lr, dropout)
        self.count_samples = count_samples

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        if self.count_samples:
            self.log("test/samples", float(len(batch["y"])), reduce_fx="sum")


class NoValidation(pl.LightningModule):
    """A module with a training step only: no objective to choose checkpoints or tune on."""

    def __init__(self, in_features: int, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(in_features, 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

"""A task of its own: regression of y = sin(x . w) + noise with a mean squared error, on dict batches.

`Waves` is an ordinary LightningDataModule: it takes the per-device batch as `batch_size` and states the size
the module needs (`sizes = ("in_features",)`); `Regressor` takes that size, its own `hidden` and `dropout`, and
the run's learning rate (`lr`, scaled with the global batch when `optim.lr_scaling` says so)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class _Points(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class Waves(pl.LightningDataModule):
    """`n` points in [-1, 1]^in_features, split 80/10/10 into train, val and test (the same split every run)."""

    sizes = ("in_features",)  # stated before setup(): the module's constructor gets it

    def __init__(self, n: int = 1024, in_features: int = 4, noise: float = 0.05, batch_size: int = 32,
                 num_workers: int = 0, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.n, self.in_features, self.noise = n, in_features, noise
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed

    def setup(self, stage: str | None = None) -> None:
        gen = torch.Generator().manual_seed(1234)
        x = torch.rand(self.n, self.in_features, generator=gen) * 2 - 1
        y = torch.sin(x @ torch.linspace(0.5, 1.5, self.in_features)) + self.noise * torch.randn(self.n, generator=gen)
        a, b = int(self.n * 0.8), int(self.n * 0.9)
        self.parts = {"train": _Points(x[:a], y[:a]), "val": _Points(x[a:b], y[a:b]), "test": _Points(x[b:], y[b:])}

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.parts["train"], batch_size=self.batch_size, shuffle=True, drop_last=True,
                          generator=gen, num_workers=self.num_workers)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.parts["val"], batch_size=128)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.parts["test"], batch_size=128)


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

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch["x"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

"""A LightningDataModule as lightning-hydra-template projects write theirs: torchvision's MNIST, train and test
concatenated and split by a seeded random_split, a global batch divided by the world size in `setup`."""

from typing import Any

import torch
from lightning import LightningDataModule
from torch.utils.data import ConcatDataset, DataLoader, Dataset, random_split
from torchvision.datasets import MNIST
from torchvision.transforms import transforms


class MNISTDataModule(LightningDataModule):
    def __init__(
        self,
        data_dir: str = "data/",
        train_val_test_split: tuple[int, int, int] = (55_000, 5_000, 10_000),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.transforms = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        self.data_train: Dataset | None = None
        self.data_val: Dataset | None = None
        self.data_test: Dataset | None = None
        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def prepare_data(self) -> None:
        MNIST(self.hparams.data_dir, train=True, download=True)
        MNIST(self.hparams.data_dir, train=False, download=True)

    def setup(self, stage: str | None = None) -> None:
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(f"batch size {self.hparams.batch_size} is not divisible by the world size")
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if not self.data_train and not self.data_val and not self.data_test:
            train = MNIST(self.hparams.data_dir, train=True, transform=self.transforms)
            test = MNIST(self.hparams.data_dir, train=False, transform=self.transforms)
            self.data_train, self.data_val, self.data_test = random_split(
                ConcatDataset([train, test]), self.hparams.train_val_test_split, torch.Generator().manual_seed(42)
            )

    def _loader(self, data: Any, shuffle: bool) -> DataLoader:
        return DataLoader(
            data, self.batch_size_per_device, shuffle=shuffle,
            num_workers=self.hparams.num_workers, pin_memory=self.hparams.pin_memory,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, False)

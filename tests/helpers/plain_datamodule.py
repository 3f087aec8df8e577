"""An ordinary user LightningDataModule: its own DataLoaders, none of the project's samplers. Each rank
writes the training sample indices it saw to `record_dir/rank<N>.json` (to check that DDP shards it)."""

import json
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset


class Recorded(Dataset):
    """n samples of 1x8x8 whose class (0-3) lights a quarter of the image; remembers what was read."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=gen)
        self.x = torch.rand(n, 1, 8, 8, generator=gen) * 0.3
        for i, label in enumerate(self.y.tolist()):
            self.x[i, 0, 2 * label : 2 * label + 2] += 1.0
        self.seen: list[int] = []

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append(index)
        return self.x[index], self.y[index]


class PlainDataModule(pl.LightningDataModule):
    num_classes = 4
    input_shape = (1, 8, 8)

    def __init__(self, record_dir: str, batch_size: int = 32, num_workers: int = 0, n_train: int = 256) -> None:
        super().__init__()
        self.record_dir, self.batch_size, self.num_workers = Path(record_dir), batch_size, num_workers
        self.train, self.val, self.test = Recorded(n_train, 0), Recorded(64, 1), Recorded(64, 2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size, num_workers=self.num_workers)

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.record_dir.mkdir(parents=True, exist_ok=True)
            rank = self.trainer.global_rank if self.trainer is not None else 0
            (self.record_dir / f"rank{rank}.json").write_text(json.dumps(self.train.seen))


class FixedBatchDataModule(PlainDataModule):
    """Takes batch_size and ignores it: its loaders always yield batches of `fixed` (a hard-coded habit)."""

    def __init__(self, record_dir: str, batch_size: int = 32, fixed: int = 10) -> None:
        super().__init__(record_dir, batch_size)
        self.fixed = fixed

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.fixed, shuffle=True)

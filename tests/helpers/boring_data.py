"""Lightning's demo data module with the batch size the plan gives (its own loaders take one sample a batch)."""

from pytorch_lightning.demos.boring_classes import BoringDataModule
from torch.utils.data import DataLoader


class BoringData(BoringDataModule):
    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test, batch_size=self.batch_size)

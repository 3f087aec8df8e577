"""A callback that makes one rank fail mid-training, to test how a run dies."""

import pytorch_lightning as pl


class FailOnRank(pl.Callback):
    def __init__(self, rank: int = 1, at_batch: int = 2) -> None:
        self.rank, self.at_batch = rank, at_batch

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and batch_idx == self.at_batch:
            raise RuntimeError(f"planted failure on rank {self.rank}")

"""A callback that slows training down, so a test can interrupt a job in the middle."""

import time

import pytorch_lightning as pl


class SlowSteps(pl.Callback):
    def __init__(self, seconds: float = 0.2) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        time.sleep(self.seconds)

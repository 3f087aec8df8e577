"""A callback that slows training down, so a test can interrupt a job in the middle."""

import os
import time

import pytorch_lightning as pl


class SlowSteps(pl.Callback):
    def __init__(self, seconds: float = 0.2) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        time.sleep(self.seconds)


class SlowStart(pl.Callback):
    """Holds the first attempt of a run between building and training (`marker` written as it waits)."""

    def __init__(self, marker: str, seconds: float = 20.0) -> None:
        self.marker, self.seconds = marker, seconds

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(self.seconds)


class SlowTest(pl.Callback):
    """Holds the first attempt of a run in its test (`marker` written as it waits)."""

    def __init__(self, marker: str, seconds: float = 20.0) -> None:
        self.marker, self.seconds = marker, seconds

    def on_test_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(self.seconds)

"""A callback that sends this process a signal when a given optimizer step is done (deterministic interrupts)."""

import os
import signal

import pytorch_lightning as pl


class SignalAt(pl.Callback):
    """`rank`: only that rank's process gets the signal (None: every process that runs this callback)."""

    def __init__(
        self, step: int, signum: str = "SIGTERM", rank: int | None = None, during: str = "train", times: int = 1
    ) -> None:
        self.step, self.signum, self.rank, self.times = step, signal.Signals[signum], rank, times
        # "train": after the step; "validation": in the validation that follows it; "train_end": as training ends;
        # "setup": as the stage is set up (step 0)
        self.during = during
        self.sent = False

    def _send(self, trainer: pl.Trainer) -> None:
        if trainer.global_step == self.step and not self.sent and self.rank in (None, trainer.global_rank):
            self.sent = True
            for _ in range(self.times):  # twice: a second Ctrl-C before the first is acted on
                os.kill(os.getpid(), self.signum)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.during == "setup":  # as the run builds, before training takes the signals
            self._send(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.during == "train":
            self._send(trainer)

    def on_validation_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.during == "validation" and not trainer.sanity_checking:
            self._send(trainer)

    def on_train_end(self, trainer: pl.Trainer, *args) -> None:
        if self.during == "train_end":  # after the project's callbacks' own end of training
            self._send(trainer)

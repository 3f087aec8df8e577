"""A callback that sends this process a signal when a given optimizer step is done (deterministic interrupts)."""

import os
import signal

import pytorch_lightning as pl


class SignalAt(pl.Callback):
    def __init__(self, step: int, signum: str = "SIGTERM") -> None:
        self.step, self.signum = step, signal.Signals[signum]
        self.sent = False

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)

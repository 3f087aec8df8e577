"""Callbacks for the benchmarks: wall-clock times of training steps, printed by rank 0."""

import time

import pytorch_lightning as pl


class FirstStepClock(pl.Callback):
    """Prints when the first optimizer step is done (start-up benchmark)."""

    def __init__(self) -> None:
        self.done = False

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if not self.done:
            self.done = True
            print(f"first step done at {time.time():.3f}", flush=True)


class StepClock(pl.Callback):
    """Prints the steady-state rate: steps after `warmup` over their wall time (scaling benchmark)."""

    def __init__(self, warmup: int = 10) -> None:
        self.warmup = warmup
        self.start = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.start is not None and trainer.is_global_zero:
            rate = (trainer.global_step - self.warmup) / (time.perf_counter() - self.start)
            print(f"steady steps per second {rate:.4f}", flush=True)

"""Callbacks for the benchmarks: wall-clock times of training steps, printed by rank 0."""

import time

import pytorch_lightning as pl
import torch


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


class StepWindowClock(pl.Callback):
    """Prints the milliseconds per optimizer step between the ends of steps `first` and `last` of one run (cheap
    step benchmark): start-up, validation and the end of the run stay outside the window."""

    def __init__(self, first: int = 100, last: int = 800, say: bool = True) -> None:
        self.first, self.last, self.say = first, last, say
        self.start: float | None = None
        self.ms_per_step: float | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        at_edge = trainer.global_step in (self.first, self.last)
        if at_edge and pl_module.device.type == "cuda":  # the GPU's queue is the time; waiting only at the edges,
            torch.cuda.synchronize()  # as the plain loop does, keeps the steps between them pipelined
        if trainer.global_step == self.first and self.start is None:
            self.start = time.perf_counter()
        elif trainer.global_step == self.last and self.start is not None and self.ms_per_step is None:
            self.ms_per_step = (time.perf_counter() - self.start) / (self.last - self.first) * 1000
            if self.say and trainer.is_global_zero:
                print(f"ms per step {self.ms_per_step:.6f}", flush=True)

"""The epoch a checkpoint's name and a metrics row give is the one its last optimizer step was taken in.

Lightning counts an epoch as finished once `fit`'s loop leaves it, also one cut short by a step budget, and its
`current_epoch` moves on before `on_train_end`. The final validation of a run stopped between validations runs
there (hydralight.resume.last_checkpoint), so its best checkpoint was named after the next epoch (epoch002 for
a run stopped in epoch 1) and its metrics.csv rows carried that epoch, which a resumed run, continuing epoch 1,
then went back from.
"""

from __future__ import annotations

import pytorch_lightning as pl

from hydralight.lightning_internals import BestCheckpoint, align_logging_step, epoch_of_last_step
from hydralight.training.loggers import HistoryLogger

__all__ = [
    "BestCheckpoint",
    "EpochOfLastStep",
    "LoggedAtItsStep",
    "epoch_of_last_step",
]  # BestCheckpoint: conf/callbacks' target


class EpochOfLastStep(pl.Callback):
    """The history's rows of a validation run after its epoch was counted as finished carry the epoch of
    the step they are logged at, as every other row of that step does."""

    def _history(self, trainer: pl.Trainer) -> list[HistoryLogger]:
        return [logger for logger in trainer.loggers if isinstance(logger, HistoryLogger)]

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = epoch_of_last_step(trainer)
        if trainer.sanity_checking or epoch == trainer.current_epoch:
            return
        for history in self._history(trainer):
            history.epoch_of_rows = epoch

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for history in self._history(trainer):
            history.epoch_of_rows = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.on_validation_end(trainer, pl_module)


class LoggedAtItsStep(pl.Callback):
    """A resumed run logs every row at the step an uninterrupted run logs it. Lightning's logging step can be
    one ahead after a restart at an epoch boundary; this runs first of the callbacks at each batch start,
    before the learning-rate monitor logs there."""

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        align_logging_step(trainer)

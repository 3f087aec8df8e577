"""The epoch a checkpoint's name and a metrics row give is the one its last optimizer step was taken in.

Lightning counts an epoch as finished once `fit`'s loop leaves it, also one cut short by a step budget, and its
`current_epoch` moves on before `on_train_end`. The final validation of a run stopped between validations runs
there (hydralight.resume.last_checkpoint), so its best checkpoint was named after the next epoch (epoch002 for
a run stopped in epoch 1) and its metrics.csv rows carried that epoch, which a resumed run, continuing epoch 1,
then went back from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from hydralight.training.loggers import HistoryLogger

if TYPE_CHECKING:
    from pytorch_lightning.loops.progress import _StartedTracker


def epoch_of_last_step(trainer: pl.Trainer) -> int:
    """The epoch (from 0, as Lightning counts) the latest step belongs to: the last one started. The loop's
    `started` counter is not moved by the end of an epoch, as `current_epoch` (its `completed`) is."""
    # The tracker is a _StartedTracker; `_Progress` declares its base, which has no `started`.
    current = cast("_StartedTracker", trainer.fit_loop.epoch_progress.current)
    return max(0, current.started - 1)


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, its `{epoch}` the epoch of the checkpoint's last step."""

    @property
    def state_key(self) -> str:
        # The key Lightning's own class saves its state under (best score and path): a run saved with it
        # continues with its best checkpoint.
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, torch.Tensor]:
        candidates = super()._monitor_candidates(trainer)
        if "epoch" not in trainer.callback_metrics and trainer.state.fn == "fit":  # a module's own `epoch` stands
            candidates["epoch"] = torch.tensor(epoch_of_last_step(trainer))
        return candidates


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

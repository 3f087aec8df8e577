"""Averaged weights (EMA, SWA) on Lightning's `WeightAveraging`: validated, checkpointed and tested with the
average; `last.ckpt` also holds the current weights and the average's state, so a resumed run continues both.

Lightning restores the current weights from a checkpoint whenever its averaging callback has an average,
also when the test stage loads the best checkpoint after `fit`: the test would then score the current weights,
not the average that was validated and saved. Outside `fit` these leave the checkpoint's weights (the
average) in place.

Lightning also validates, saves and ends `fit` with the average before it has taken in any weights (SWA
before its start epoch, EMA before its first update): that is the copy made when `fit` started, the untrained
network, which a best checkpoint would then hold. Until the first update the current weights are used.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EMAWeightAveraging, WeightAveraging

from hydralight.lightning_internals import averaged_updates, swap_average


class _Averaged:
    _swapped = False

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != "fit":
            return  # the checkpoint's weights are the average: those are tested
        super().on_load_checkpoint(trainer, pl_module, checkpoint)  # type: ignore[misc]

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swapped = averaged_updates(self) > 0
        if self._swapped:
            swap_average(self, pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._swapped:
            swap_average(self, pl_module)
            self._swapped = False

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)  # type: ignore[misc]
        if "current_model_state" in checkpoint and averaged_updates(self) == 0:
            checkpoint["state_dict"] = checkpoint["current_model_state"]  # no average yet: the weights trained

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if averaged_updates(self) > 0:
            super().on_train_end(trainer, pl_module)  # type: ignore[misc]


class EMA(_Averaged, EMAWeightAveraging):
    """An exponential moving average of the weights, updated every `update_every_n_steps` optimizer steps."""


class SWA(_Averaged, WeightAveraging):
    """Stochastic weight averaging: the equal-weighted average of the weights at the end of every epoch from
    `start_epoch` (counted from 0) on, and at the run's last step.

    The weights an epoch ends with join the average at its last optimizer step, before that epoch's
    validation (Lightning's epoch-end update comes after it: the validation of epoch E would leave out epoch
    E's weights); the step is the callback's saved state, so a resumed run never adds them twice."""

    def __init__(self, start_epoch: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_epoch = start_epoch
        self._ends_epoch = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        last = trainer.is_last_batch or batch_idx + 1 >= trainer.num_training_batches
        self._ends_epoch = trainer.current_epoch >= self.start_epoch and (
            last or trainer.global_step == trainer.max_steps
        )
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and self._ends_epoch

"""Averaged weights (EMA, SWA) on Lightning's `WeightAveraging`: validated, checkpointed and tested with the
average; `last.ckpt` also holds the current weights and the average's state, so a resumed run continues both.

Lightning restores the current weights from a checkpoint whenever its averaging callback has an average,
also when the test stage loads the best checkpoint after `fit`: the test would then score the current weights,
not the average that was validated and saved. Outside `fit` these leave the checkpoint's weights (the
average) in place.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EMAWeightAveraging, WeightAveraging


class _TestedAsSaved:
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != "fit":
            return  # the checkpoint's weights are the average: those are tested
        super().on_load_checkpoint(trainer, pl_module, checkpoint)  # type: ignore[misc]


class EMA(_TestedAsSaved, EMAWeightAveraging):
    """An exponential moving average of the weights, updated every `update_every_n_steps` optimizer steps."""


class SWA(_TestedAsSaved, WeightAveraging):
    """Stochastic weight averaging: the equal-weighted average of the weights at the end of every epoch from
    `start_epoch` (counted from 0) on."""

    def __init__(self, start_epoch: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_epoch = start_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return epoch_idx is not None and epoch_idx >= self.start_epoch

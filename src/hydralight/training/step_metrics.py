"""What any module logs per training step reaches the loggers at the steps a report needs: the last step
before each validation and at the end of each epoch and of training, whatever `trainer.log_every_n_steps` says."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from hydralight.lightning_internals import accumulating, loggers_write_this_step, logging_step, step_values_for_loggers


class StepMetricsAtValidation(pl.Callback):
    """Lightning writes step values (`self.log(..., on_step=True)`) to the loggers only every
    `trainer.log_every_n_steps` steps: a run shorter than that (experiment=fast logs every 100) had no training
    loss in csv/metrics.csv, and its report an empty loss panel. This writes the module's latest step values,
    as Lightning would have written them (same names, same step, with `epoch`), before each validation and at
    each epoch's and the run's end, unless Lightning wrote that step itself; any module, the built-in
    built-in ones included, gets the points.
    """

    def __init__(self) -> None:
        # The latest stepping batch's logged values that Lightning will not write: (step, epoch, values).
        self._pending: tuple[int, int, dict[str, Any]] | None = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning's own decision, taken right after this hook (training_epoch_loop.advance): no write while
        # gradients accumulate, and a write at its logging steps (and at a stop).
        if accumulating(trainer) and pl_module.automatic_optimization:
            return
        # fast_dev_run is set on the Trainer by Lightning's connectors, which its class does not declare.
        if loggers_write_this_step(trainer) or trainer.fast_dev_run:  # type: ignore[attr-defined]
            self._pending = None
            return
        # The values have to be taken now: the next step's logging and the epoch's end replace them.
        values = step_values_for_loggers(trainer)
        self._pending = (logging_step(trainer), trainer.current_epoch, values) if values else None

    def _write(self, trainer: pl.Trainer) -> None:
        if self._pending is None:
            return
        step, epoch, values = self._pending
        self._pending = None
        scalars = {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}
        for logger in trainer.loggers:  # each logger writes on rank 0 only
            logger.log_metrics({**scalars, "epoch": epoch}, step=step)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._write(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer)
